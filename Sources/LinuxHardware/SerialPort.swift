#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor
import Reactor

/// A UART (or any tty: a USB serial adapter, a pseudo-terminal) opened raw,
/// 8 data bits, no parity, 1 stop bit, no flow control: what an HM-10
/// module speaks at its default 9600 baud.
public enum SerialPort {
    /// Why a serial device could not be used.
    public struct OpenError: Error, CustomStringConvertible, Equatable {
        public var description: String
    }

    /// The rates termios can set that an HM-10 supports (AT+BAUD0…8).
    public static let rates: [Int: speed_t] = [
        1200: speed_t(B1200), 2400: speed_t(B2400), 4800: speed_t(B4800), 9600: speed_t(B9600), 19200: speed_t(B19200),
        38400: speed_t(B38400), 57600: speed_t(B57600), 115_200: speed_t(B115200), 230_400: speed_t(B230400),
    ]

    /// Opens `path` non-blocking and close-on-exec, never as the controlling
    /// terminal, raw 8N1 at `baud`, with anything already received or
    /// queued thrown away. Returns the descriptor.
    public static func open(_ path: String, baud: Int) throws(OpenError) -> Int32 {
        guard let speed = rates[baud] else { throw OpenError(description: "\(baud) baud is not a rate this port can use (\(rates.keys.sorted().map(String.init).joined(separator: ", ")))") }
        let fd = Glibc.open(path, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            switch code {
            case ENOENT: throw OpenError(description: "\(path) does not exist (on a Raspberry Pi: enable_uart=1 in config.txt, or plug in the USB adapter)")
            case EACCES: throw OpenError(description: "\(path): permission denied (the service user needs group dialout)")
            case EBUSY: throw OpenError(description: "\(path) is in use by another program (a serial console? Bluetooth on the Pi's UART?)")
            default: throw OpenError(description: "\(path): \(String(cString: strerror(code)))")
            }
        }
        var attributes = termios()
        guard tcgetattr(fd, &attributes) == 0 else {
            let code = errno
            close(fd)
            throw OpenError(description: "\(path) is not a serial port (\(String(cString: strerror(code))))")
        }
        // Raw: no line editing, echo, signals or byte translation (termios(3),
        // cfmakeraw); the receiver on, modem lines ignored, no flow control.
        cfmakeraw(&attributes)
        attributes.c_cflag |= tcflag_t(CLOCAL | CREAD)
        attributes.c_cflag &= ~(tcflag_t(CSTOPB | PARENB) | tcflag_t(CRTSCTS))
        attributes.c_iflag &= ~tcflag_t(IXON | IXOFF | IXANY)
        cfsetispeed(&attributes, speed)
        cfsetospeed(&attributes, speed)
        guard tcsetattr(fd, TCSANOW, &attributes) == 0 else {
            let code = errno
            close(fd)
            throw OpenError(description: "\(path): cannot set \(baud) baud 8N1 (\(String(cString: strerror(code))))")
        }
        tcflush(fd, TCIOFLUSH)
        return fd
    }

    /// The time one byte takes on the line at `baud`: 10 bits (start, 8
    /// data, stop).
    public static func byteTime(baud: Int) -> Duration {
        .nanoseconds(Int64(10_000_000_000 / max(baud, 1)))
    }
}

/// A pseudo-terminal pair (pty(7)): the slave is a tty a program opens by
/// path like a UART; whoever holds the master plays the device on the other
/// end (tests and benchmarks: an emulated HM-10).
public struct PseudoTerminal: Sendable {
    /// The master side's descriptor (blocking, close-on-exec).
    public let master: Int32
    /// The slave's path, e.g. `/dev/pts/5`.
    public let slavePath: String
    /// A descriptor of the slave held open for the pair's lifetime, so the
    /// master never sees the hang-up (EIO) of a slave nobody has open while
    /// the program under test opens and closes it; raw from the start, so
    /// nothing written before the program sets its own mode is echoed.
    public let slaveHold: Int32

    public init() throws(SerialPort.OpenError) {
        var name = [CChar](repeating: 0, count: 128)
        let fd = creactor_open_pty(&name, name.count)
        guard fd >= 0 else {
            throw SerialPort.OpenError(description: "no pseudo-terminal: \(String(cString: strerror(errno)))")
        }
        master = fd
        slavePath = String(nulTerminated: name)
        slaveHold = Glibc.open(slavePath, O_RDWR | O_NOCTTY | O_CLOEXEC)
        var attributes = termios()
        guard slaveHold >= 0, tcgetattr(slaveHold, &attributes) == 0 else {
            Glibc.close(fd)
            throw SerialPort.OpenError(description: "\(slavePath): \(String(cString: strerror(errno)))")
        }
        cfmakeraw(&attributes)
        tcsetattr(slaveHold, TCSANOW, &attributes)
    }

    /// Closes both sides.
    public func close() {
        Glibc.close(master)
        Glibc.close(slaveHold)
    }
}
