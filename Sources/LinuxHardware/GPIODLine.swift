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
    ///   - chip: `"gpiochip0"`, `"/dev/gpiochip0"` or `"0"`; with an empty
    ///     string the line is looked up by `lineName` on every chip.
    ///   - offset: the line's offset on `chip`; ignored when `lineName` is given.
    ///   - lineName: the line's name (stable across boards and kernels, e.g.
    ///     `"GPIO17"` on a Raspberry Pi, where chip numbers moved on the Pi 5).
    ///   - activeLow: active drives the pin low (an LED wired to 3V3).
    /// - Throws: ``OpenError``.
    public init(chip: String, offset: Int?, lineName: String?, activeLow: Bool, consumer: String = "blecontrold") throws {
        self.activeLow = activeLow
        self.consumer = consumer
        self.lineName = lineName
        let chipPath = Self.chipPath(for: chip)

        if let lineName {
            guard !lineName.isEmpty else { throw OpenError.invalidArguments("empty line name") }
            if let chipPath {
                let (handle, offset) = try Self.open(chipPath: chipPath, offset: 0, name: lineName, consumer: consumer, activeLow: activeLow)
                self.handle = handle
                self.chipPath = chipPath
                self.offset = offset
                return
            }
            // No chip given: the first chip with a line of that name.
            let chips = Self.chipPaths(in: "/dev")
            var denied: String?
            for candidate in chips {
                do {
                    let (handle, offset) = try Self.open(chipPath: candidate, offset: 0, name: lineName, consumer: consumer, activeLow: activeLow)
                    self.handle = handle
                    self.chipPath = candidate
                    self.offset = offset
                    return
                } catch OpenError.noSuchLine, OpenError.notAChip {
                    continue
                } catch OpenError.permissionDenied(let path) {
                    denied = denied ?? path
                    continue
                }
            }
            if let denied { throw OpenError.permissionDenied(path: denied) }
            throw OpenError.noSuchLine(name: lineName, chips: chips)
        }

        guard let chipPath else {
            throw OpenError.invalidArguments("a line needs a name, or a chip and an offset")
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

    /// Whether the line is still held.
    public var isOpen: Bool { lock.withLock { handle != nil } }

    /// The libgpiod version linked at run time, e.g. "1.6.3".
    public static var libraryVersion: String { String(cString: blc_gpio_library_version()) }

    // MARK: Helpers

    /// The device node for a chip argument, or `nil` for "search all chips".
    public static func chipPath(for chip: String) -> String? {
        let chip = chip.trimmed
        if chip.isEmpty { return nil }
        if chip.hasPrefix("/") { return chip }
        if chip.allSatisfy(\.isNumber) { return "/dev/gpiochip\(chip)" }
        return "/dev/\(chip)"
    }

    /// The `gpiochipN` nodes in `directory`, in numeric order.
    static func chipPaths(in directory: String) -> [String] {
        let entries = Files.list(directory)
        return entries.compactMap { entry -> (Int, String)? in
            guard entry.hasPrefix("gpiochip"), let number = Int(entry.dropFirst(8)) else { return nil }
            return (number, "\(directory)/\(entry)")
        }.sorted { $0.0 < $1.0 }.map(\.1)
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
            switch code {
            case ENOENT: return .noSuchChip(path: chipPath)
            case EACCES, EPERM: return .permissionDenied(path: chipPath)
            case ENOTTY, ENODEV, EINVAL: return .notAChip(path: chipPath, errno: code)
            default: return .system(chip: chipPath, step: "opening the chip", errno: code)
            }
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
        let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return String(decoding: bytes, as: UTF8.self)
    }
}
