import Board
import Control
import Reactor
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// What `blecontrol doctor` checks against.
public struct DoctorOptions: Sendable {
    /// Where the installed service reads its board file.
    public static let installedBoardPath = "/etc/blecontrol/board.yaml"
    /// The user the systemd unit runs blecontrold as.
    public static let serviceUser = ControlClient.serviceUser
    /// The groups the unit gives that user (SupplementaryGroups=).
    public static let serviceGroups = ["i2c", "gpio", "bluetooth", "dialout"]

    /// The board file; nil: ``installedBoardPath`` if it exists, else the
    /// built-in simulator board.
    public var boardPath: String?
    /// The daemon's control socket; nil: `$BLECONTROL_SOCKET`, else the
    /// board file's `control.socket`.
    public var socketPath: String?
    /// Where `/proc`, `/sys`, `/boot`, `/etc` and `/var` are read, and the GPIO chips.
    public var system: SystemInspector
    public var environment: [String: String]

    public init(
        boardPath: String? = nil,
        socketPath: String? = nil,
        system: SystemInspector = SystemInspector(),
        environment: [String: String] = Doctor.processEnvironment()
    ) {
        self.boardPath = boardPath
        self.socketPath = socketPath
        self.system = system
        self.environment = environment
    }
}

/// The checks behind `blecontrol doctor`: the board file, the I2C buses and
/// the chips on them, the LED's and switches' GPIO lines, the service user,
/// the systemd unit, the system under it (watchdog, boot-time all-off,
/// journal, file systems), bluetoothd and the adapter, and the running
/// daemon. Every warning and failure carries one line saying what to do.
///
/// Nothing here changes the machine. The chips are probed with reads only,
/// which is safe while the daemon drives the same bus; each GPIO line is
/// requested for an instant (driven to its inactive level: the LED dark, a
/// switch off) and released, unless the daemon holds it.
///
/// A board whose buses and LED are all emulated (the simulator) needs none
/// of the hardware, and runs without the service user or BlueZ: there those
/// checks say "emulated: nothing to check" or warn instead of failing.
public enum Doctor {
    /// The process's environment as a dictionary.
    public static func processEnvironment() -> [String: String] {
        var result: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                result[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            pointer += 1
        }
        return result
    }

    /// Where a symbolic link points, nil if it is not one.
    static func linkTarget(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink(path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    public static func run(_ options: DoctorOptions) -> DoctorReport {
        var context = Context(options: options)
        let boardSection = context.checkBoard()
        var sections = [boardSection]
        if let configuration = context.configuration {
            sections.append(context.checkI2C(configuration))
            sections.append(context.checkGPIO(configuration))
            if let serial = configuration.serial { sections.append(context.checkSerial(serial)) }
            if let mqtt = configuration.mqtt { sections.append(context.checkMQTT(mqtt)) }
        }
        sections.append(context.checkService())
        sections.append(context.checkSystem())
        sections.append(context.checkBluetooth())
        sections.append(context.checkDaemon())
        return DoctorReport(boardSource: context.boardSource, sections: sections)
    }
}

/// State shared by the checks of one run. The board file is checked here;
/// each other section is an extension of its own file (I2CChecks.swift,
/// GPIOChecks.swift, SerialChecks.swift, ServiceChecks.swift,
/// SystemChecks.swift, BluetoothChecks.swift, DaemonChecks.swift).
struct Context {
    let options: DoctorOptions
    var system: SystemInspector { options.system }
    var boardPath: String?
    var boardSource: String
    var configuration: BoardConfiguration?
    /// The service user, looked up once.
    let account: SystemInspector.Account?
    /// Group ids the service runs with: the user's own plus SupplementaryGroups=.
    let serviceGroupIDs: [UInt32]
    let currentUser: String
    let quietLogger = Logger(label: "blecontrol.doctor") { _ in SwiftLogNoOpLogHandler() }

    init(options: DoctorOptions) {
        self.options = options
        boardPath = options.boardPath
            ?? (Files.exists(DoctorOptions.installedBoardPath) ? DoctorOptions.installedBoardPath : nil)
        boardSource = boardPath ?? "(built-in simulator board)"
        account = SystemInspector.account(named: DoctorOptions.serviceUser)
        serviceGroupIDs = (account?.groups ?? []) + DoctorOptions.serviceGroups.compactMap(SystemInspector.groupID(named:))
        currentUser = SystemInspector.userName(geteuid())
    }

    /// True when the board needs real hardware (a device bus or a GPIO LED).
    var isRealBoard: Bool {
        guard let configuration else { return boardPath != nil }
        if case .gpio? = configuration.led { return true }
        return configuration.buses.values.contains { $0.kind != .emulated }
    }

    /// FAIL on a real board, WARN where the simulator can do without it.
    var neededLevel: DoctorLevel { isRealBoard ? .fail : .warn }

    // MARK: Board file

    mutating func checkBoard() -> DoctorSection {
        var findings: [DoctorFinding] = []
        do throws(BoardFileError) {
            let loaded: BoardConfiguration
            if let boardPath {
                loaded = try BoardFile.load(path: boardPath)
            } else {
                loaded = try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
            }
            configuration = loaded
            let kind = isRealBoard ? "" : "; every bus and the LED are emulated"
            findings.append(DoctorFinding(.ok, "board file", "\(boardSource) is valid (board \"\(loaded.name)\"\(kind))"))
        } catch {
            let path = boardPath ?? EmbeddedBoards.simulatorPath
            let more = error.problems.count > 1 ? " (and \(error.problems.count - 1) more)" : ""
            findings.append(DoctorFinding(
                .fail, "board file", "\(error.problems.first?.description ?? "invalid")\(more)",
                fix: "edit \(path) at the line shown; `blecontrold --board \(path) --check-board` lists every problem and re-checks"
            ))
            findings.append(DoctorFinding(.warn, "hardware", "not checked: the board file says what to check"))
        }
        return DoctorSection(title: "Board", findings: findings)
    }
}
