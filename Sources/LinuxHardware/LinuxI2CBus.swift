import CLinuxI2C
import Reactor
import Hardware
import Logging
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// An I2C bus behind the kernel's i2c-dev interface (`/dev/i2c-N`).
///
/// Adapters with plain I2C (`I2C_FUNC_I2C`: the Raspberry Pi's controllers,
/// most SoCs) carry every transaction as one `I2C_RDWR` ioctl. Adapters that
/// only speak SMBus (the kernel's `i2c-stub`, some PC SMBus controllers) get
/// the same transactions translated into SMBus commands, per address in the
/// style set with ``setSMBusWriteStyle(_:for:)`` (see ``SMBusWriteStyle``).
///
/// Errors are ``I2CError`` with the kernel's error codes classified as
/// described at ``errorKind(forErrno:)``. A write-only transaction that is
/// not acknowledged is tried again up to `retries` times, waiting `backoff`,
/// then twice that, and so on, between tries (without holding the bus); a
/// device that still does not answer is the caller's to report offline.
///
/// Thread-safe: transactions from several threads never interleave.
public final class LinuxI2CBus: I2CBus, @unchecked Sendable {
    /// Why the adapter could not be opened.
    public enum OpenError: Error, Sendable, Hashable, CustomStringConvertible {
        /// No such device node.
        case noSuchDevice(path: String)
        /// The node exists but this user may not open it.
        case permissionDenied(path: String)
        /// The file opened but does not answer i2c-dev's `I2C_FUNCS`.
        case notAnAdapter(path: String, errno: Int32)
        /// Anything else from `open(2)`.
        case system(path: String, errno: Int32)
        /// No adapter has this name (`present`: each adapter there is, as
        /// `i2c-1 "bcm2835 (i2c@7e804000)"`).
        case noSuchAdapter(name: String, present: [String])
        /// Several adapters have this name (`matches`: their `i2c-N`).
        case ambiguousAdapter(name: String, matches: [String])

        public var description: String {
            switch self {
            case .noSuchDevice(let path):
                return "I2C adapter \(path) does not exist: enable the bus (Raspberry Pi: "
                    + "dtparam=i2c_arm=on in config.txt, then reboot) and load i2c-dev "
                    + "(modprobe i2c-dev, or list it in /etc/modules-load.d); i2cdetect -l lists the buses"
            case .permissionDenied(let path):
                return "permission denied opening I2C adapter \(path): run as a member of its group "
                    + "(usermod -aG i2c <user>) or install a udev rule such as "
                    + "SUBSYSTEM==\"i2c-dev\", GROUP=\"i2c\", MODE=\"0660\""
            case .notAnAdapter(let path, let errno):
                return "\(path) is not an i2c-dev adapter (I2C_FUNCS: \(errnoDescription(errno)))"
            case .system(let path, let errno):
                return "cannot open I2C adapter \(path): \(errnoDescription(errno))"
            case .noSuchAdapter(let name, let present):
                let here = present.isEmpty ? "there are no I2C adapters (is the bus enabled?)" : "adapters: \(present.joined(separator: ", "))"
                return "no I2C adapter is named \"\(name)\"; \(here)"
            case .ambiguousAdapter(let name, let matches):
                return "more than one I2C adapter is named \"\(name)\" (\(matches.joined(separator: ", "))): name the bus by its device instead"
            }
        }
    }

    /// The device node, e.g. `/dev/i2c-1`.
    public let path: String
    /// What the adapter can do, as it reported at open.
    public let functionality: I2CFunctionality
    /// How many more times a not-acknowledged write is tried.
    public let retries: Int
    /// The wait before the first retry; it doubles for each later one.
    public let backoff: Duration

    /// Whether transactions go out as SMBus commands (the adapter lacks plain I2C).
    public var usesSMBus: Bool { !functionality.contains(.i2c) }

    /// `nil` with plain I2C; with SMBus, a command byte and one block of
    /// `I2C_SMBUS_BLOCK_MAX` (32) data bytes (SMBus 3.0 §6.5.7).
    public var maxWriteLength: Int? { usesSMBus ? SMBusTranslation.blockMax + 1 : nil }

    private let fd: Int32
    private let logger: Logger
    private let lock = Lock()
    /// Guarded by `lock`.
    private var styles: [I2CAddress: SMBusWriteStyle] = [:]
    /// The address i2c-dev's `I2C_SLAVE` last pointed SMBus calls at; guarded by `lock`.
    private var selectedAddress: I2CAddress?

    /// Opens the adapter and reads what it can do.
    ///
    /// - Parameters:
    ///   - path: the device node, e.g. `/dev/i2c-1` (see ``findAdapter(named:)``).
    ///   - logger: where the open and retries are logged (retries at debug level).
    ///   - retries: extra tries for a not-acknowledged write (0: none).
    ///   - backoff: wait before the first retry, doubled for each further one.
    /// - Throws: ``OpenError``.
    public init(path: String, logger: Logger = Logger(label: "blecontrol.i2c"), retries: Int = 2, backoff: Duration = .milliseconds(1)) throws {
        let fd = blc_i2c_open(path)
        if fd < 0 {
            switch -fd {
            case ENOENT, ENODEV, ENXIO: throw OpenError.noSuchDevice(path: path)
            case EACCES, EPERM: throw OpenError.permissionDenied(path: path)
            case EISDIR: throw OpenError.notAnAdapter(path: path, errno: EISDIR)
            default: throw OpenError.system(path: path, errno: -fd)
            }
        }
        var funcs: UInt = 0
        let result = blc_i2c_functionality(fd, &funcs)
        if result < 0 {
            _ = blc_i2c_close(fd)
            throw OpenError.notAnAdapter(path: path, errno: -result)
        }
        self.fd = fd
        self.path = path
        self.functionality = I2CFunctionality(rawValue: funcs)
        self.retries = max(retries, 0)
        self.backoff = backoff
        self.logger = logger
        let how = functionality.contains(.i2c) ? "plain I2C (I2C_RDWR)" : "SMBus commands only"
        logger.info("opened I2C adapter \(path): \(how); functionality: \(functionality)")
    }

    deinit {
        _ = blc_i2c_close(fd)
    }

    // MARK: SMBus write style

    /// Sets how writes to `address` are expressed in SMBus commands (e.g.
    /// ``SMBusWriteStyle/byteStream`` for a PCF8574 LCD backpack).
    public func setSMBusWriteStyle(_ style: SMBusWriteStyle, for address: I2CAddress) {
        lock.withLock { styles[address] = style }
    }

    /// The SMBus write style used for `address`.
    public func smbusWriteStyle(for address: I2CAddress) -> SMBusWriteStyle {
        lock.withLock { styles[address] ?? .registerBlock }
    }

    // MARK: Transfers

    @discardableResult
    public func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
        if messages.isEmpty { return [] }
        let context = Self.describe(messages)
        for case .read(let count) in messages where count < 0 {
            throw I2CError(.system(errno: EINVAL), address: address, context: "\(context): negative read length")
        }
        let retryNACK = messages.allSatisfy { message in
            if case .write = message { return true }
            return false
        }
        if !usesSMBus {
            return try attempt(retryingNACK: retryNACK, address: address, context: context) {
                try rdwr(messages, address: address)
            }
        }

        let plan: [SMBusOperation]
        do {
            plan = try SMBusTranslation.plan(for: messages, style: smbusWriteStyle(for: address), functionality: functionality)
        } catch let error as SMBusTranslationError {
            throw I2CError(.notSupported, address: address, context: "\(context): \(error.reason)")
        }
        let readCount = messages.filter { message in
            if case .read = message { return true }
            return false
        }.count
        var replies = [[UInt8]](repeating: [], count: readCount)
        for operation in plan {
            // Each SMBus command is its own transaction: retry only the one that failed.
            let bytes = try attempt(retryingNACK: operation.isWrite, address: address, context: "\(context) (\(operation))") {
                try smbus(operation, address: address)
            }
            if let reply = operation.reply { replies[reply].append(contentsOf: bytes) }
        }
        return replies
    }

    /// A failed call: the kernel's errno and, where the errno alone would
    /// mislead, the kind and explanation to report instead.
    private struct Failure: Error {
        var errno: Int32
        var kind: I2CError.Kind?
        var note: String?
    }

    /// Runs `body` with the bus held, retrying a not-acknowledged write with
    /// exponential backoff (slept with the bus released).
    private func attempt<T>(
        retryingNACK: Bool,
        address: I2CAddress,
        context: @autoclosure () -> String,
        _ body: () throws -> T
    ) throws -> T {
        var tries = 0
        while true {
            do {
                return try lock.withLock { try body() }
            } catch let failure as Failure {
                let kind = failure.kind ?? Self.errorKind(forErrno: failure.errno)
                tries += 1
                if kind == .noAcknowledge && retryingNACK && tries <= retries {
                    let delay = backoff * (1 << (tries - 1))
                    logger.debug("I2C \(address) on \(path): no acknowledge, retry \(tries) of \(retries) in \(delay)")
                    Self.sleep(delay)
                    continue
                }
                var detail = context()
                if let note = failure.note { detail += "; " + note }
                if tries > 1 { detail += " (\(tries) tries)" }
                if case .system = kind { detail += ": " + errnoDescription(failure.errno) }
                throw I2CError(kind, address: address, context: detail)
            }
        }
    }

    /// One `I2C_RDWR` transaction. Called with the lock held.
    private func rdwr(_ messages: [I2CMessage], address: I2CAddress) throws -> [[UInt8]] {
        guard messages.count <= Int(I2C_RDWR_IOCTL_MAX_MSGS) else {
            throw Failure(errno: EINVAL, kind: .notSupported, note: "i2c-dev takes at most \(I2C_RDWR_IOCTL_MAX_MSGS) messages per transaction")
        }
        var buffers: [UnsafeMutableBufferPointer<UInt8>] = []
        defer { buffers.forEach { $0.deallocate() } }
        var segments: [blc_i2c_segment] = []
        for message in messages {
            let length: Int
            switch message {
            case .write(let bytes): length = bytes.count
            case .read(let count): length = count
            }
            guard length <= Int(UInt16.max) else {
                throw Failure(errno: EINVAL, kind: .notSupported, note: "a message of \(length) bytes is too long for i2c-dev")
            }
            let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: max(length, 1))
            buffer.initialize(repeating: 0)
            buffers.append(buffer)
            var isRead = false
            switch message {
            case .write(let bytes): _ = buffer.update(fromContentsOf: bytes)
            case .read: isRead = true
            }
            segments.append(blc_i2c_segment(buffer: buffer.baseAddress, length: UInt16(length), read: isRead))
        }
        let result = segments.withUnsafeMutableBufferPointer { segments in
            blc_i2c_rdwr(fd, UInt16(address.rawValue), segments.baseAddress!, UInt32(segments.count))
        }
        if result < 0 { throw Failure(errno: -result) }
        if result != Int32(messages.count) {
            throw Failure(errno: EIO, kind: .busError, note: "the adapter completed \(result) of \(messages.count) messages")
        }
        var replies: [[UInt8]] = []
        for (index, message) in messages.enumerated() {
            if case .read(let count) = message {
                replies.append(Array(buffers[index].prefix(count)))
            }
        }
        return replies
    }

    /// One SMBus command. Called with the lock held.
    private func smbus(_ operation: SMBusOperation, address: I2CAddress) throws -> [UInt8] {
        if selectedAddress != address {
            let result = blc_i2c_set_address(fd, UInt16(address.rawValue))
            if result < 0 {
                selectedAddress = nil
                if -result == EBUSY {
                    throw Failure(errno: EBUSY, kind: .system(errno: EBUSY),
                                  note: "a kernel driver has claimed this address (see /sys/bus/i2c/devices/*-00\(hex(address.rawValue).dropFirst(2)))")
                }
                throw Failure(errno: -result)
            }
            selectedAddress = address
        }
        func check(_ result: Int32) throws -> Int32 {
            if result < 0 { throw Failure(errno: -result) }
            return result
        }
        switch operation {
        case .quickWrite:
            _ = try check(blc_smbus_quick_write(fd))
            return []
        case .sendByte(let value):
            _ = try check(blc_smbus_send_byte(fd, value))
            return []
        case .writeByteData(let command, let value):
            _ = try check(blc_smbus_write_byte_data(fd, command, value))
            return []
        case .writeWordData(let command, let value):
            _ = try check(blc_smbus_write_word_data(fd, command, value))
            return []
        case .writeBlock(let command, let data):
            _ = try check(data.withUnsafeBufferPointer { data in
                blc_smbus_write_i2c_block(fd, command, UInt8(data.count), data.baseAddress!)
            })
            return []
        case .receiveByte:
            return [UInt8(truncatingIfNeeded: try check(blc_smbus_receive_byte(fd)))]
        case .readByteData(let command, _):
            return [UInt8(truncatingIfNeeded: try check(blc_smbus_read_byte_data(fd, command)))]
        case .readWordData(let command, _):
            let word = try check(blc_smbus_read_word_data(fd, command))
            return [UInt8(truncatingIfNeeded: word), UInt8(truncatingIfNeeded: word >> 8)]
        case .readBlock(let command, let count, _):
            var buffer = [UInt8](repeating: 0, count: SMBusTranslation.blockMax)
            let got = try check(buffer.withUnsafeMutableBufferPointer { buffer in
                blc_smbus_read_i2c_block(fd, command, UInt8(count), buffer.baseAddress!)
            })
            guard got == count else {
                throw Failure(errno: EPROTO, kind: .busError, note: "block read returned \(got) of \(count) bytes")
            }
            return Array(buffer.prefix(count))
        }
    }

    // MARK: Helpers

    /// How the kernel's I2C error codes (kernel `Documentation/i2c/fault-codes.rst`)
    /// are reported:
    /// - `ENXIO` (address not acknowledged), `EREMOTEIO` (what the Pi's
    ///   bcm2835 and many SoC drivers return for a NACK) and `ENODEV` (what
    ///   i2c-stub returns for an address it does not emulate: nothing there)
    ///   → ``I2CError/Kind/noAcknowledge``;
    /// - `ETIMEDOUT` → ``I2CError/Kind/timeout``;
    /// - `EAGAIN` (arbitration lost; the i2c core has already retried it
    ///   `adapter->retries` times), `EIO` (the adapters' catch-all for a
    ///   transfer that went wrong on the wire), `EPROTO` and `EBADMSG` (SMBus
    ///   block length or PEC wrong), `EBUSY` (bus held busy too long)
    ///   → ``I2CError/Kind/busError``;
    /// - `EOPNOTSUPP` (the adapter cannot do this transfer) → ``I2CError/Kind/notSupported``;
    /// - anything else → ``I2CError/Kind/system(errno:)``.
    ///
    /// `EINTR` never gets here: the C shim retries it.
    static func errorKind(forErrno code: Int32) -> I2CError.Kind {
        switch code {
        case ENXIO, EREMOTEIO, ENODEV: return .noAcknowledge
        case ETIMEDOUT: return .timeout
        case EAGAIN, EIO, EPROTO, EBADMSG, EBUSY: return .busError
        case EOPNOTSUPP: return .notSupported
        default: return .system(errno: code)
        }
    }

    /// The i2c-dev node of the adapter whose sysfs `name` is `name` (e.g.
    /// "SMBus stub driver" for i2c-stub), or `nil`. Bus numbers depend on
    /// probe order; names do not. The first of several with that name.
    public static func findAdapter(named name: String) -> String? {
        findAdapter(named: name, sysfsDevices: "/sys/bus/i2c/devices", deviceDirectory: "/dev")
    }

    static func findAdapter(named name: String, sysfsDevices: String, deviceDirectory: String) -> String? {
        adapters(sysfsDevices: sysfsDevices).first { $0.name == name }.map { "\(deviceDirectory)/i2c-\($0.number)" }
    }

    /// The adapters the kernel knows, by number, with their names
    /// (`/sys/bus/i2c/devices/i2c-N/name`: "bcm2835 (i2c@7e804000)" for a
    /// Raspberry Pi's header bus), in numeric order.
    public static func adapters(sysfsDevices: String = "/sys/bus/i2c/devices") -> [(number: Int, name: String)] {
        Files.list(sysfsDevices).compactMap { entry -> (number: Int, name: String)? in
            // i2c-N are adapters; N-00AA entries are the devices on them.
            guard entry.hasPrefix("i2c-"), let number = Int(entry.dropFirst(4)),
                  let name = Files.text("\(sysfsDevices)/\(entry)/name", limit: 4096) else { return nil }
            return (number, name.trimmed)
        }.sorted { $0.number < $1.number }
    }

    /// The i2c-dev node of the one adapter named `name`: a bus given by
    /// name stays the same bus when the kernel numbers its adapters another
    /// way. Looked up when the bus is opened, so the adapter may come and go.
    /// - Throws: ``OpenError/noSuchAdapter(name:present:)`` listing the
    ///   adapters there are, ``OpenError/ambiguousAdapter(name:matches:)``.
    public static func devicePath(
        adapterNamed name: String, sysfsDevices: String = "/sys/bus/i2c/devices", deviceDirectory: String = "/dev"
    ) throws(OpenError) -> String {
        let all = adapters(sysfsDevices: sysfsDevices)
        let matches = all.filter { $0.name == name }
        if matches.count > 1 { throw .ambiguousAdapter(name: name, matches: matches.map { "i2c-\($0.number)" }) }
        guard let match = matches.first else {
            throw .noSuchAdapter(name: name, present: all.map { "i2c-\($0.number) \"\($0.name)\"" })
        }
        return "\(deviceDirectory)/i2c-\(match.number)"
    }

    static func describe(_ messages: [I2CMessage]) -> String {
        messages.map { message -> String in
            switch message {
            case .write(let bytes): return "write \(bytes.count) bytes"
            case .read(let count): return "read \(count) bytes"
            }
        }.joined(separator: ", ")
    }

    private static func sleep(_ duration: Duration) {
        sleepThread(duration)
    }
}

/// "EACCES (Permission denied)" style text for an errno value.
func errnoDescription(_ code: Int32) -> String {
    let message = String(cString: strerror(code))
    return "errno \(code) (\(message))"
}
