import Arguments
import Doctor

/// `blecontrol doctor`: what is wrong with this board, and the fix.
func doctorCommand() -> Command { Command(
    "doctor",
    abstract: "Check the board file, I2C, the GPIO lines, the service user, the system, BlueZ and the daemon; print a fix for each problem.",
    discussion: """
    Each check prints OK, WARN or FAIL; a WARN or FAIL is followed by one line saying what to do. Exit status 0 when \
    nothing failed, 1 otherwise. The chips are probed with reads only, which is safe while blecontrold runs. On a board \
    whose buses are emulated (the simulator) the hardware checks have nothing to check, and what only a real board needs \
    (the service user, bluetoothd) only warns. The System checks (the hardware watchdog and whether systemd arms it, the \
    boot-time all-off, the journal's limits, the file systems and their ext4 errors) warn on a Raspberry Pi and on the \
    SD-card image, and only report elsewhere. Run it with sudo to probe buses your own user may not open.
    """,
    options: [
        Command.Option("board", value: "FILE", help: "Board file (YAML). Default: \(DoctorOptions.installedBoardPath) if present, else the built-in simulator board."),
        Command.Option("socket", value: "PATH", help: "The daemon's control socket. Default: $BLECONTROL_SOCKET, else the board file's control.socket."),
        Command.Option("system-root", value: "DIR", help: "Read /proc, /sys, /boot, /etc and /var under this directory (for tests).", hidden: true),
    ]
) { arguments in
    let report = Doctor.run(DoctorOptions(
        boardPath: arguments.option("board"),
        socketPath: arguments.option("socket"),
        system: SystemInspector(root: arguments.option("system-root") ?? "/")
    ))
    print(report.rendered(), terminator: "")
    if report.hasFailures { throw ExitFailure.silent(1) }
}
}
