import ArgumentParser
import Firmware
import Foundation

extension BLEControlCLI {
    /// `blecontrol doctor`: what is wrong with this board, and the fix.
    struct Doctor: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check the board file, I2C, the LED line, the service user, BlueZ and the daemon; print a fix for each problem.",
            discussion: """
            Each check prints OK, WARN or FAIL; a WARN or FAIL is followed by one line saying \
            what to do. Exit status 0 when nothing failed, 1 otherwise. The chips are probed \
            with reads only, which is safe while blecontrold runs. On a board whose buses \
            are emulated (the simulator) the hardware checks have nothing to check, and \
            what only a real board needs (the service user, bluetoothd) only warns. \
            Run it with sudo to probe buses your own user may not open.
            """
        )

        @Option(name: .long, help: "Board file (YAML). Default: \(DoctorOptions.installedBoardPath) if present, else the built-in simulator board.")
        var board: String?

        @Option(name: .long, help: "The daemon's control socket. Default: $BLECONTROL_SOCKET, else the board file's control.socket.")
        var socket: String?

        @Option(name: .long, help: ArgumentHelp("Read /proc, /sys and /boot under this directory (for tests).", visibility: .hidden))
        var systemRoot: String = "/"

        func run() throws {
            let report = Firmware.Doctor.run(DoctorOptions(
                boardPath: board,
                socketPath: socket,
                system: SystemInspector(root: systemRoot)
            ))
            print(report.rendered(), terminator: "")
            if report.hasFailures { throw ExitCode(1) }
        }
    }
}
