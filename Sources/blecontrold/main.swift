#if canImport(Glibc)
import Glibc
#endif
import Arguments
import Board
import Control
import Runtime
import Logging
import Reactor

// First of all, before any thread exists: one malloc arena and fixed
// thresholds, locked memory or not (ProcessMemory says why).
ProcessMemory.configureAllocator()

// Before anything else, and before any other thread exists: every signal
// that would end the process is blocked in every thread and delivered
// through a signalfd instead (Reactor's SignalSource). None can take its
// default action and leave the outputs pulsing, and one that arrives while
// the board starts waits, pending, until the loop reads it. The source is
// a global: it lives as long as the process, whatever the optimiser thinks.
let signals: SignalSource
do {
    signals = try SignalSource(signals: SignalSource.terminating)
} catch {
    printError("blecontrold: cannot set up signal handling: \(error)")
    exit(1)
}
// A client vanishing mid-write must not kill the daemon.
signal(SIGPIPE, SIG_IGN)

func bootstrapLogging(_ level: Logger.Level) {
    LoggingSystem.bootstrap { label in JournalLogHandler(label: label, level: level) }
}

/// Reads the board file named by --board, or the built-in simulator board;
/// a bad file is a message on stderr and exit status 2.
func loadBoard(_ path: String?) throws -> BoardConfiguration {
    do {
        if let path { return try BoardFile.load(path: path) }
        return try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
    } catch {
        throw ExitFailure(JournalLogHandler.errorLines("\(error)"), status: 2)
    }
}

let boardOption = Command.Option("board", value: "FILE", help: "Board file (YAML). Default: the built-in simulator board.")

let recordOption = Command.Option("record", value: "FILE",
                                  help: "The record of the outputs the daemon drives (the packaged units use \(OutputsRecord.defaultPath)).")

let safeOutputs = Command(
    "safe-outputs",
    abstract: "Switch every PCA9685 output off with one write, and servo.output_enable to disabled, and exit (for ExecStopPost=).",
    examples: ["blecontrold safe-outputs --record /var/lib/blecontrol/driven-outputs --board /etc/blecontrol/board.yaml"],
    discussion: """
    After a crash (kill -9, a fault, the watchdog) the chip keeps producing the last pulses; systemd runs this afterwards. \
    What it switches off comes first from --record, the chips and line the daemon recorded when it started (a reload cannot \
    change them), so a board file edited since, broken or naming another chip, cannot keep it from the chips really driven. \
    Without a record it reads --board leniently: only its buses and servo chips and output_enable, unknown keys and other \
    sections ignored. It prints where its list came from and what it did. \
    It is the one command that writes to the chip without the board's instance lock, on purpose: the daemon \
    that held it is gone or hung, and an all-off write is safe in any state. \
    At boot (blecontrol-safe-outputs.service) it also switches off what the chip kept producing through a reboot \
    (a watchdog reset or a reboot does not cut the chip's power), before anything else starts.
    """,
    options: [
        boardOption,
        recordOption,
        Command.Option("wait-for-bus", value: "SECONDS",
                       help: "Wait up to SECONDS (0-300, default 0) for the servo bus's device to appear (at boot, udev creates it)."),
    ]
) { arguments in
    bootstrapLogging(.warning)
    let wait = try arguments.integer("wait-for-bus", in: 0...300, default: 0)
    var outputs: DrivenOutputs?
    var notes: [String] = []
    if let record = arguments.option("record") {
        do {
            outputs = try OutputsRecord.read(record)
            if outputs != nil { notes.append("from \(record), as the daemon recorded them at its start") } else { notes.append("no record at \(record)") }
        } catch {
            notes.append("record not used: \(error)")
        }
    }
    if outputs == nil {
        if let path = arguments.option("board") {
            let text: String
            do {
                let bytes = try Files.read(path, limit: BoardFile.maximumSize)
                text = String(decoding: bytes, as: UTF8.self)
            } catch {
                throw ExitFailure("safe-outputs: \(notes.joined(separator: "; ")); board file \(path): \(error)")
            }
            let (read, problems) = BoardFile.drivenOutputs(leniently: text, path: path)
            outputs = read
            notes.append("from the board file \(path), read leniently" + (problems.isEmpty ? "" : " (left out: \(problems.map(\.description).joined(separator: "; ")))"))
        } else {
            outputs = DrivenOutputs(try loadBoard(nil))
            notes.append("the built-in simulator board")
        }
    }
    print("chips and lines: " + notes.joined(separator: "; "))
    do {
        print(try BoardBuses.safeOutputs(outputs!, waitingUpTo: .seconds(wait), logger: Logger(label: "blecontrold")))
    } catch {
        throw ExitFailure("safe-outputs: \(error)")
    }
}

let run = Command(
    "run",
    abstract: "BLEControl board firmware: drives servos, ESCs, PWM outputs, a character LCD and a status LED from BLEControl frames.",
    examples: ["blecontrold                                   # the simulator board",
               "blecontrold --board /etc/blecontrol/board.yaml",
               "blecontrold --board my-board.yaml --check-board"],
    discussion: """
    With no --board, runs the built-in simulator board (emulated PCA9685, 16×2 LCD and LED; TCP on 127.0.0.1:7171). \
    SIGTERM and SIGINT (and every other signal that would end the process) switch every output off and exit; \
    SIGHUP reloads the board file. Exit status 2: the board file or the arguments are wrong; 1: the board cannot start \
    (a device, a port, or another blecontrold already running it).
    """,
    options: [
        boardOption,
        Command.Option("socket", value: "PATH", help: "The control socket to create, instead of the board file's control.socket (blecontrol --socket names the same socket).",
                       aliases: ["control-socket"]),
        Command.Option("tcp", value: "HOST:PORT", help: "Override the TCP listen address of the board file (port 0 picks a free one). Off loopback only if the board file itself listens off loopback (transports.tcp.allow_network)."),
        Command.Option("log-level", value: "LEVEL", help: "trace, debug, info, notice, warning, error or critical (default info)."),
        recordOption,
    ],
    flags: [Command.Flag("check-board", help: "Validate the board file and exit.")]
) { arguments in
    let levelName = arguments.option("log-level") ?? "info"
    guard let level = Logger.Level(rawValue: levelName) else {
        throw UsageError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
    }
    var tcpOverride: TCPConfiguration?
    if let tcp = arguments.option("tcp") {
        guard let endpoint = TCPConfiguration(endpoint: tcp) else {
            throw UsageError("--tcp must be HOST:PORT (e.g. 127.0.0.1:7171 or [::1]:0), got \(tcp)")
        }
        tcpOverride = endpoint
    }
    bootstrapLogging(level)
    let logger = Logger(label: "blecontrold")
    let boardPath = arguments.option("board")
    let configuration = try loadBoard(boardPath)
    if arguments.flag("check-board") {
        print("\(configuration.sourcePath): OK (\(configuration.name))")
        return
    }
    // The command line may move the TCP transport, not take it off
    // loopback: that is the board file's decision (allow_network).
    if let tcpOverride, !tcpOverride.isLoopback, configuration.tcp?.isLoopback ?? true {
        throw UsageError("--tcp \(tcpOverride.host):\(tcpOverride.port) is not a loopback address: anything that connects could drive the outputs; the board file must listen off loopback itself (transports.tcp.allow_network: true)")
    }
    if configuration.lockMemory {
        // Page faults on the servo path would be latency nobody asked for.
        // Before any thread: their stacks are locked as they are touched.
        switch ProcessMemory.lockAll() {
        case .onFault:
            break
        case .whole:
            logger.notice("lock_memory: this kernel has no MCL_ONFAULT (Linux 4.4+): every mapping locked whole")
        case .failed(let reason):
            logger.warning("lock_memory: mlockall failed (\(reason)); raise LimitMEMLOCK or run as root")
        }
    }

    let socketPath = arguments.option("socket") ?? configuration.controlSocketPath
    if Files.directory(of: socketPath) == UserRuntime.fallbackDirectory() {
        // The private directory of `control.socket: private` without
        // $XDG_RUNTIME_DIR: made 0700 here, before the control server
        // would make it with the usual 0755.
        do {
            try UserRuntime.makePrivateDirectory(UserRuntime.fallbackDirectory())
        } catch {
            logger.critical("cannot start: the control socket's directory: \(error)")
            throw ExitFailure.silent(1)
        }
    }
    let runtime: BoardRuntime
    do {
        runtime = try BoardRuntime(configuration: configuration, logger: logger, controlSocketPath: socketPath, outputsRecord: arguments.option("record"))
    } catch {
        logger.critical("cannot start: \(error)")
        throw ExitFailure.silent(1)
    }
    let stopRequested = Promise<Int32>()
    do {
        try runtime.start(tcpOverride: tcpOverride.map { ($0.host, $0.port) }) { loop in
            // On the loop, before any transport accepts.
            try signals.attach(to: loop) { signal, sender in
                if signal == SIGHUP {
                    logger.notice("SIGHUP\(sender > 0 ? " from pid \(sender)" : ""): reloading \(boardPath ?? configuration.sourcePath)")
                    runtime.reload(path: boardPath)
                    return
                }
                logger.notice("\(SignalSource.name(signal))\(sender > 0 ? " from pid \(sender)" : ""): stopping, every output off")
                stopRequested.fulfil(signal)
            }
        }
    } catch {
        logger.critical("cannot start: \(error)")
        runtime.stop()
        throw ExitFailure.silent(1)
    }
    logger.notice("board \"\(configuration.name)\" running")
    _ = stopRequested.wait()
    runtime.stop()
    logger.notice("stopped; every output off")
}

/// What blecontrold(8) says beyond the options: how it runs under systemd,
/// its signals, files and exit statuses.
let manual = Manual(section: 8, sections: [
    Manual.Section("Signals", [
        .item("SIGTERM, SIGINT", "Stop: every output off (servos, ESCs and PWM outputs stop pulsing, switches to their safe state), the LCD says so, then exit 0. Every other signal that would end a process (SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, …) does the same: none can leave the outputs pulsing."),
        .item("SIGHUP", "Read the board file again and apply what a running board can take: the channels (roles, calibration, failsafe), servo pacing, the failsafe timeouts, the protocol's idle timeout, and the TCP and BLE transports (restarted: their centrals reconnect). A file that changes what needs a restart (the name, buses, chips, the LCD, the LED, the serial transport, the control socket, realtime) is refused, and so is an invalid one, with the reason in the log: the board keeps running as before. `systemctl reload blecontrold` sends it."),
        .item("SIGKILL", "Cannot be caught: the PCA9685 keeps producing the last pulses. The unit's ExecStopPost= runs `blecontrold safe-outputs`, which switches them off (\"Crash cleanup\" below)."),
    ]),
    Manual.Section("Crash cleanup", [
        .paragraph("1. At start, once its instance lock is taken and before any device is opened, `blecontrold run --record FILE` writes FILE (the package: /var/lib/blecontrol/driven-outputs): the bus and address of each PCA9685 on a real bus, and servo.output_enable's line. It writes a new file beside the old one, syncs it and renames it over, so a power cut leaves one or the other whole. A reload cannot change these (it refuses new buses, chips or output_enable), so the record stays true for the daemon's life."),
        .paragraph("2. When the daemon ends however it ends (a stop, a crash, kill -9, the watchdog), systemd runs `blecontrold safe-outputs --record FILE --board /etc/blecontrol/board.yaml`. It believes FILE only if it is a regular file (not a link), neither it nor its directory writable by group or others, owned by root or by its directory's owner, and a complete record; then it switches off exactly those chips and that line, whatever the board file says by then (a typo, another address)."),
        .paragraph("3. Without a record it can believe, it reads the board file leniently: only the buses and the servo section's chips and output_enable; unknown keys and every other section are ignored, and a chip whose entry is wrong is left out and named."),
        .paragraph("4. Each chip gets ALL_LED_OFF (every output fully off) in one write, even when another chip fails; servo.output_enable is driven to disabled. It prints where its list came from and one line per chip and line; any failure is exit status 1 with every chip's outcome."),
        .paragraph("5. At boot, blecontrol-safe-outputs.service does the same with --wait-for-bus 30, before bluetoothd and the daemon."),
    ]),
    Manual.Section("Failsafe", [
        .paragraph("When a central that commands an output disconnects (whatever other centrals, or the MQTT broker, are still connected; a central that never commanded an output is only an observer), when a central in control sends nothing of its own for failsafe.silence_timeout_ms (judged per central: another central's frames keep nobody else alive), when the PCA9685 fails for failsafe.fault_timeout_ms, or when the servo thread is stuck in one bus write for failsafe.stall_timeout_ms, every channel goes to its failsafe (blecontrol-board(5): hold, off, or a pulse; an ESC gets its neutral pulse, then none). The LED blinks fast and the LCD shows FAILSAFE and the reason. A failsafe a central took with it ends when a central's command for one of the outputs it left is accepted (INIT, text and another central's commands of its own outputs end nothing); one for a fault or a stall ends with any central's accepted command. The operator at the board ends any failsafe with `sudo blecontrol failsafe clear` (logged with who). An ESC stays at its failsafe output until its channel is enabled again and given a new value, so a motor never resumes the throttle it had."),
    ]),
    Manual.Section("Limits", [
        .paragraph("Whatever a sender does, its cost is bounded (protocol.md, \"Limits\"). Each central draws a burst of 8 ERROR replies, then 20 a second; bad frames past that are refused and counted (status: the session's errors and replies_dropped) but not answered. The board announces a Maximum Packet Size of 16 KiB to its MQTT broker and drops a larger message unread; it handles at most 16 KiB of MQTT payload per turn of its event loop. A TCP connection whose first bytes are not a frame is closed before anything is applied; one that sends no frame within 5 s is closed too, and such connections never hold the last 8 of transports.tcp.max_connections (the oldest makes way for a new one), so silent connections cannot lock a central out (the control socket: 10 s for the first request, and the last 8 of its 64 slots kept the same way). Every TCP connection has keepalive on (probes after 10 s of silence, every 5 s, 3 unanswered close it) and TCP_USER_TIMEOUT 30 s: a LAN central whose link dies without a word is seen to leave, and its failsafe taken, within about 25 s (30 s with data unacknowledged)."),
    ]),
    Manual.Section("Systemd", [
        .paragraph("The package's blecontrold.service runs `blecontrold --board /etc/blecontrol/board.yaml` as the system user blecontrol (groups i2c, gpio, bluetooth, dialout), after bluetooth.service, hardened (`systemd-analyze security blecontrold` rates it). It is Type=notify: READY=1 once every transport listens, STATUS= with the board's state, and WATCHDOG=1 from the servo thread, so a stuck servo thread is killed and restarted (WatchdogSec=5s). ExecStopPost= switches the outputs off however the daemon ended. The package enables and starts it, restarts it on upgrade (the old daemon stops with every output off) and stops it on removal."),
        .paragraph("blecontrol-safe-outputs.service runs `blecontrold safe-outputs --wait-for-bus 30` early at every boot, before bluetoothd and the daemon: the PCA9685 keeps its power and its last pulses through a reboot or a hardware-watchdog reset of the board, until something writes to it. The package enables it."),
    ]),
    Manual.Section("Logging", [
        .paragraph("Messages go to standard error, which systemd's journal keeps: `journalctl -u blecontrold`. Under systemd each line carries its priority, so `journalctl -u blecontrold -p err` shows only the errors, and `-p warning` the warnings too. --log-level sets what is written (default info)."),
        .paragraph("A message is always one line: control characters and invalid UTF-8 that came from outside (a payload, a topic, a device's name) are escaped (\\n, \\x1b, …), so no sender can start a journal entry of its own or choose its priority, and a line is cut at 1024 characters. Each place in the code logs at most 20 lines a minute; the next line from it says how many were held back."),
    ]),
    Manual.Section("Files", [
        .item("/etc/blecontrol/board.yaml", "The board file the service runs (blecontrol-board(5)); kept across upgrades."),
        .item("/usr/share/blecontrol/boards/", "Example board files: raspberry-pi.yaml, rc-car.yaml, hexapod.yaml, simulator.yaml (the built-in simulator board)."),
        .item("/var/lib/blecontrol/driven-outputs", "The record of the chips and line the daemon drives, for safe-outputs (\"Crash cleanup\")."),
        .item("/run/blecontrol/control.sock", "The control socket blecontrol(1) talks to (the board file's control.socket). The instance lock (blecontrold-BOARD.lock) is made beside it: a directory that others may write (such as /tmp) is refused, and so is a lock that is a link or another user's file."),
        .item("$XDG_RUNTIME_DIR/blecontrol-simulator.sock", "The built-in simulator board's control socket (control.socket: private), in the directory only its user can write."),
        .item("/tmp/blecontrol-UID/simulator.sock", "The same without $XDG_RUNTIME_DIR: the daemon makes the directory with mode 0700, and refuses one that belongs to another user or that others may write."),
        .item("/usr/share/doc/blecontrol/protocol.md", "The BLEControl wire protocol: frames, the ERROR reply, the LCD length rule."),
    ]),
    Manual.Section("Exit status", [
        .item("0", "Stopped by a signal, every output off; or --check-board found the board file valid."),
        .item("1", "The board cannot start: a device, a port, or another blecontrold already running the same board."),
        .item("2", "The board file or the command line is wrong (the message names the file, line and key)."),
    ]),
    Manual.Section("Examples", [
        .paragraph("Run the simulator board (emulated chips, TCP on 127.0.0.1:7171) and look at it:"),
        .example(["blecontrold &", "blecontrol status"]),
        .paragraph("Check an edited board file before reloading the service with it:"),
        .example(["blecontrold --board /etc/blecontrol/board.yaml --check-board", "sudo systemctl reload blecontrold"]),
    ]),
    Manual.Section("See also", [
        .paragraph("blecontrol(1), blecontrol-board(5), systemd.service(5), journalctl(1), bluetoothd(8)"),
    ]),
])

Command(
    "blecontrold",
    abstract: "BLEControl board firmware.",
    subcommands: [run, safeOutputs],
    defaultSubcommand: "run"
).main(version: BLEControlVersion.string, manual: manual)
