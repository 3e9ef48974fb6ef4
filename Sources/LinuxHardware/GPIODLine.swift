import CGPIOD
import Reactor
import Hardware
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One GPIO output line through libgpiod (1.6 or 2.x, chosen when the C shim
/// is compiled), held for as long as this object lives.
///
/// The line is requested as an output driven to its inactive level from the
/// moment of the request, under a consumer label (`gpioinfo` shows it).
/// ``close()`` or deinit releases it; the kernel then returns it to its
/// default, and so does process exit.
///
/// Thread-safe.
public final class GPIODLine: DigitalOutput, @unchecked Sendable {
    /// Why the line could not be requested.
    public enum OpenError: Error, Sendable, Hashable, CustomStringConvertible {
        /// Neither a line name nor a chip and offset were given.
        case invalidArguments(String)
        /// No such chip device node.
        case noSuchChip(path: String)
        /// The path exists but is not a GPIO character device.
        case notAChip(path: String, errno: Int32)
        /// No chip searched has a line of this name (`chips` lists those searched).
        case noSuchLine(name: String, chips: [String])
        /// No chip has this label (`chips`: each chip as "gpiochip0 [label]").
        case noSuchChipLabel(label: String, chips: [String])
        /// Several chips have a line of this name, so it does not say which
        /// is meant: a chip must be named.
        case ambiguousLine(name: String, chips: [String])
        /// Several chips have this label.
        case ambiguousChipLabel(label: String, chips: [String])
        /// The chip has fewer lines.
        case offsetOutOfRange(chip: String, offset: Int, lineCount: Int)
        /// Another consumer (a process, or a kernel driver) holds the line.
        case lineBusy(chip: String, offset: Int, holder: String?)
        /// This user may not open the chip.
        case permissionDenied(path: String)
        /// Anything else, with the step that failed.
        case system(chip: String, step: String, errno: Int32)

        public var description: String {
            switch self {
            case .invalidArguments(let why):
                return "GPIO line: \(why)"
            case .noSuchChip(let path):
                return "GPIO chip \(path) does not exist (gpiodetect lists the chips)"
            case .notAChip(let path, let errno):
                return "\(path) is not a GPIO chip (\(errnoDescription(errno)))"
            case .noSuchLine(let name, let chips):
                if chips.isEmpty {
                    return "GPIO line \"\(name)\" not found: there are no GPIO chips in /dev"
                }
                return "GPIO line \"\(name)\" not found on \(chips.joined(separator: ", ")) (gpioinfo lists line names)"
            case .noSuchChipLabel(let label, let chips):
                if chips.isEmpty { return "no GPIO chip labelled \"\(label)\": there are no GPIO chips in /dev" }
                return "no GPIO chip labelled \"\(label)\" (chips: \(chips.joined(separator: ", ")))"
            case .ambiguousLine(let name, let chips):
                return "GPIO line \"\(name)\" is on more than one chip (\(chips.joined(separator: ", "))): name the chip"
            case .ambiguousChipLabel(let label, let chips):
                return "more than one GPIO chip is labelled \"\(label)\" (\(chips.joined(separator: ", "))): name the chip by its device, e.g. \(chips.first ?? "gpiochip0")"
            case .offsetOutOfRange(let chip, let offset, let lineCount):
                return "GPIO chip \(chip) has no line \(offset): it has \(lineCount) lines (0…\(max(lineCount - 1, 0)))"
            case .lineBusy(let chip, let offset, let holder):
                let who = holder.map { $0.isEmpty ? "another consumer" : "\"\($0)\"" } ?? "another consumer"
                return "GPIO \(chip) line \(offset) is busy: held by \(who) (a kernel driver, another process, or an overlay that claims the pin)"
            case .permissionDenied(let path):
                return "permission denied opening GPIO chip \(path): run as a member of its group "
                    + "(usermod -aG gpio <user>) or install a udev rule such as "
                    + "SUBSYSTEM==\"gpio\", KERNEL==\"gpiochip*\", GROUP=\"gpio\", MODE=\"0660\""
            case .system(let chip, let step, let errno):
                return "GPIO \(chip): \(step) failed: \(errnoDescription(errno))"
            }
        }
    }

    /// The chip's device node, e.g. `/dev/gpiochip0`.
    public let chipPath: String
    /// The line's offset on the chip (looked up when requested by name).
    public let offset: Int
    /// The name the line was requested by, if any.
    public let lineName: String?
    /// Whether active means a low level on the pin.
    public let activeLow: Bool
    /// The consumer label the line is held under.
    public let consumer: String

    private let lock = Lock()
    /// Guarded by `lock`; `nil` once closed.
    private var handle: OpaquePointer?

    /// Requests a line as an output, initially inactive.
    ///
    /// - Parameters:
    ///   - chip: the chip, however ``ChipName`` reads it: `"gpiochip0"`,
    ///     `"/dev/gpiochip0"`, `"0"`, or its label (`"pinctrl-rp1"`); with
    ///     an empty string the line is looked up by `lineName` on every chip.
    ///   - offset: the line's offset on `chip`; ignored when `lineName` is given.
    ///   - lineName: the line's name (stable across boards and kernels, e.g.
    ///     `"GPIO17"` on a Raspberry Pi, where chip numbers moved on the Pi 5).
    ///   - activeLow: active drives the pin low (an LED wired to 3V3).
    ///   - chips: where chips and names are looked up (the machine's own).
    /// - Throws: ``OpenError``.
    public init(
        chip: String, offset: Int?, lineName: String?, activeLow: Bool, consumer: String = "blecontrold",
        chips: any GPIOChipCatalog = SystemGPIOChips()
    ) throws {
        self.activeLow = activeLow
        self.consumer = consumer
        self.lineName = lineName
        if lineName?.isEmpty == true { throw OpenError.invalidArguments("empty line name") }
        let chipPath = try Self.locate(chip: chip, lineName: lineName, in: chips)

        if let lineName {
            let (handle, offset) = try Self.open(chipPath: chipPath, offset: 0, name: lineName, consumer: consumer, activeLow: activeLow)
            self.handle = handle
            self.chipPath = chipPath
            self.offset = offset
            return
        }
        guard let offset else {
            throw OpenError.invalidArguments("no offset or line name given for chip \(chipPath)")
        }
        guard offset >= 0, offset <= Int(UInt32.max) else {
            throw OpenError.offsetOutOfRange(chip: chipPath, offset: offset, lineCount: 0)
        }
        let (handle, resolved) = try Self.open(chipPath: chipPath, offset: UInt32(offset), name: nil, consumer: consumer, activeLow: activeLow)
        self.handle = handle
        self.chipPath = chipPath
        self.offset = resolved
    }

    deinit {
        if let handle { blc_gpio_line_close(handle) }
    }

    /// "gpiochip0 line 17 (GPIO17)", for logs and errors.
    public var label: String {
        let chip = chipPath.hasPrefix("/dev/") ? String(chipPath.dropFirst(5)) : chipPath
        if let lineName { return "\(chip) line \(offset) (\(lineName))" }
        return "\(chip) line \(offset)"
    }

    /// Drives the line active (`true`) or inactive.
    /// - Throws: ``DigitalOutputError`` naming the line and the errno.
    public func set(_ active: Bool) throws {
        try lock.withLock {
            guard let handle else {
                throw DigitalOutputError(line: label, context: "line already released")
            }
            let result = blc_gpio_line_set(handle, active ? 1 : 0)
            if result < 0 {
                throw DigitalOutputError(line: label, context: "set \(active ? "active" : "inactive"): \(errnoDescription(-result))")
            }
        }
    }

    /// Releases the line. Later ``set(_:)`` calls throw. Idempotent.
    public func close() {
        lock.withLock {
            if let handle { blc_gpio_line_close(handle) }
            handle = nil
        }
    }

    /// The libgpiod version linked at run time, e.g. "1.6.3".
    public static var libraryVersion: String { String(cString: blc_gpio_library_version()) }

    // MARK: Helpers

    /// What a board file's `chip:` names.
    public enum ChipName: Sendable, Equatable {
        /// Nothing: the line is looked up by name on every chip.
        case any
        /// A device node: `/dev/gpiochip0`, also written `gpiochip0` or `0`.
        case path(String)
        /// A chip label (`pinctrl-rp1`): numbers change between kernels and
        /// models, labels do not.
        case label(String)

        public init(_ chip: String) {
            let chip = chip.trimmed
            if chip.isEmpty {
                self = .any
            } else if chip.hasPrefix("/") {
                self = .path(chip)
            } else if chip.allSatisfy(\.isNumber) {
                self = .path("/dev/gpiochip\(chip)")
            } else if chip.hasPrefix("gpiochip"), !chip.dropFirst(8).isEmpty, chip.dropFirst(8).allSatisfy(\.isNumber) {
                self = .path("/dev/\(chip)")
            } else {
                self = .label(chip)
            }
        }
    }

    /// The device node of the chip that `chip` and `lineName` designate:
    /// the chip named by path or label, or, with no chip, the one chip that
    /// has a line called `lineName`. A name found on two chips, or a label
    /// two chips share, is an error naming both: the first one found could
    /// be the wrong pin. Chips this user may not open are passed over; when
    /// that leaves nothing, the error is theirs.
    /// - Throws: ``OpenError``.
    public static func locate(chip: String, lineName: String?, in chips: any GPIOChipCatalog) throws(OpenError) -> String {
        switch ChipName(chip) {
        case .path(let path):
            return path
        case .label(let label):
            var matches: [String] = []
            var present: [String] = []
            var denied: String?
            for path in chips.chipPaths() {
                do throws(OpenError) {
                    let found = try chips.label(of: path)
                    present.append(describe(path, label: found))
                    if found == label { matches.append(path) }
                } catch .permissionDenied {
                    denied = denied ?? path
                } catch {
                    continue
                }
            }
            if matches.count > 1 { throw .ambiguousChipLabel(label: label, chips: matches.map { describe($0, label: label) }) }
            if let match = matches.first { return match }
            if let denied { throw .permissionDenied(path: denied) }
            throw .noSuchChipLabel(label: label, chips: present)
        case .any:
            guard let lineName else { throw .invalidArguments("a line needs a name, or a chip and an offset") }
            let paths = chips.chipPaths()
            var matches: [String] = []
            var denied: String?
            for path in paths {
                do throws(OpenError) {
                    if try chips.offset(of: lineName, on: path) != nil { matches.append(path) }
                } catch .permissionDenied {
                    denied = denied ?? path
                } catch {
                    continue
                }
            }
            if matches.count > 1 {
                throw .ambiguousLine(name: lineName, chips: matches.map { path in describe(path, label: try? chips.label(of: path)) })
            }
            if let match = matches.first { return match }
            if let denied { throw .permissionDenied(path: denied) }
            throw .noSuchLine(name: lineName, chips: paths)
        }
    }

    /// "gpiochip4 [pinctrl-rp1]", as gpiodetect prints a chip.
    public static func describe(_ path: String, label: String?) -> String {
        let name = path.hasPrefix("/dev/") ? String(path.dropFirst(5)) : path
        return label.map { "\(name) [\($0)]" } ?? name
    }

    /// The `gpiochipN` nodes in `directory`, in numeric order.
    static func chipPaths(in directory: String) -> [String] {
        let entries = Files.list(directory)
        return entries.compactMap { entry -> (Int, String)? in
            guard entry.hasPrefix("gpiochip"), let number = Int(entry.dropFirst(8)) else { return nil }
            return (number, "\(directory)/\(entry)")
        }.sorted { $0.0 < $1.0 }.map(\.1)
    }

    /// The error for a failed open of the chip itself, from its errno.
    static func chipError(_ code: Int32, chipPath: String) -> OpenError {
        switch code {
        case ENOENT: return .noSuchChip(path: chipPath)
        case EACCES, EPERM: return .permissionDenied(path: chipPath)
        case ENOTTY, ENODEV, EINVAL: return .notAChip(path: chipPath, errno: code)
        default: return .system(chip: chipPath, step: "opening the chip", errno: code)
        }
    }

    private static func open(
        chipPath: String,
        offset: UInt32,
        name: String?,
        consumer: String,
        activeLow: Bool
    ) throws -> (OpaquePointer, Int) {
        var result = blc_gpio_open_result()
        let handle: OpaquePointer? = chipPath.withCString { chipPointer in
            consumer.withCString { consumerPointer in
                if let name {
                    return name.withCString { namePointer in
                        blc_gpio_line_open(chipPointer, offset, namePointer, consumerPointer, activeLow, 0, &result)
                    }
                }
                return blc_gpio_line_open(chipPointer, offset, nil, consumerPointer, activeLow, 0, &result)
            }
        }
        if let handle { return (handle, Int(result.offset)) }
        throw openError(result, chipPath: chipPath, name: name)
    }

    private static func openError(_ result: blc_gpio_open_result, chipPath: String, name: String?) -> OpenError {
        let code = result.error
        switch result.stage {
        case BLC_GPIO_STAGE_CHIP:
            return chipError(code, chipPath: chipPath)
        case BLC_GPIO_STAGE_LINE:
            if let name, code == ENOENT { return .noSuchLine(name: name, chips: [chipPath]) }
            if name == nil, code == EINVAL {
                return .offsetOutOfRange(chip: chipPath, offset: Int(result.offset), lineCount: Int(result.num_lines))
            }
            return .system(chip: chipPath, step: "finding the line", errno: code)
        default:
            switch code {
            case EBUSY:
                return .lineBusy(chip: chipPath, offset: Int(result.offset), holder: holder(chipPath: chipPath, offset: result.offset))
            case EACCES, EPERM:
                return .permissionDenied(path: chipPath)
            case EINVAL where name == nil && result.num_lines == 0:
                // 2.x without chip info: the kernel rejected the offset.
                return .offsetOutOfRange(chip: chipPath, offset: Int(result.offset), lineCount: 0)
            default:
                return .system(chip: chipPath, step: "requesting line \(result.offset) as an output", errno: code)
            }
        }
    }

    /// The consumer label holding a busy line, if it can be read.
    private static func holder(chipPath: String, offset: UInt32) -> String? {
        var buffer = [CChar](repeating: 0, count: 64)
        let result = buffer.withUnsafeMutableBufferPointer { buffer in
            blc_gpio_line_consumer(chipPath, offset, buffer.baseAddress!, buffer.count)
        }
        guard result == 0 else { return nil }
        return String(nulTerminated: buffer)
    }
}

/// The GPIO chips of a machine, as much of them as finding a line needs.
/// ``SystemGPIOChips`` is the machine's own; tests hand in made-up ones.
public protocol GPIOChipCatalog: Sendable {
    /// The chips' device nodes (`/dev/gpiochip0`, …), in numeric order.
    func chipPaths() -> [String]
    /// The chip's label, e.g. `pinctrl-bcm2711` or `pinctrl-rp1`.
    func label(of chip: String) throws(GPIODLine.OpenError) -> String
    /// The offset of the line called `name` on `chip`; nil when it has none.
    func offset(of name: String, on chip: String) throws(GPIODLine.OpenError) -> Int?
}

/// The chips in /dev, read through libgpiod.
public struct SystemGPIOChips: GPIOChipCatalog {
    /// Where the `gpiochipN` nodes are.
    public var directory: String

    public init(directory: String = "/dev") {
        self.directory = directory
    }

    public func chipPaths() -> [String] {
        GPIODLine.chipPaths(in: directory)
    }

    public func label(of chip: String) throws(GPIODLine.OpenError) -> String {
        var buffer = [CChar](repeating: 0, count: 64)
        let result = buffer.withUnsafeMutableBufferPointer { blc_gpio_chip_label(chip, $0.baseAddress!, $0.count) }
        if result < 0 { throw GPIODLine.chipError(-result, chipPath: chip) }
        return String(nulTerminated: buffer)
    }

    public func offset(of name: String, on chip: String) throws(GPIODLine.OpenError) -> Int? {
        var offset: UInt32 = 0
        let result = blc_gpio_chip_find_line(chip, name, &offset)
        if result < 0 { throw GPIODLine.chipError(-result, chipPath: chip) }
        return result == 0 ? Int(offset) : nil
    }
}
