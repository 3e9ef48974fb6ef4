#if canImport(Glibc)
import Glibc
#endif
import Arguments
import Board
import Control
import Firmware
import Logging
import Reactor

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
        throw ExitFailure("\(error)", status: 2)
    }
}

let boardOption = Command.Option("board", value: "FILE", help: "Board file (YAML). Default: the built-in simulator board.")

let safeOutputs = Command(
    "safe-outputs",
    abstract: "Switch every PCA9685 output off with one write and exit (for ExecStopPost=).",
    discussion: """
    After a crash (kill -9, a fault) the chip keeps producing the last pulses; systemd runs this afterwards. \
    It is the one command that writes to the chip without the board's instance lock, on purpose: the daemon \
    that held it is gone or hung, and an all-off write is safe in any state.
    """,
    options: [boardOption]
) { arguments in
    bootstrapLogging(.warning)
    let configuration = try loadBoard(arguments.option("board"))
    do {
        print(try BoardBuses.safeOutputs(configuration, logger: Logger(label: "blecontrold")))
    } catch {
        throw ExitFailure("safe-outputs: \(error)")
    }
}

let run = Command(
    "run",
    abstract: "BLEControl board firmware: drives servos, ESCs, PWM outputs, a character LCD and a status LED from BLEControl frames.",
    discussion: """
    With no --board, runs the built-in simulator board (emulated PCA9685, 16×2 LCD and LED; TCP on 127.0.0.1:7171). \
    SIGTERM and SIGINT (and every other signal that would end the process) switch every output off and exit; \
    SIGHUP reloads the board file. Exit status 2: the board file or the arguments are wrong; 1: the board cannot start \
    (a device, a port, or another blecontrold already running it).
    """,
    options: [
        boardOption,
        Command.Option("control-socket", value: "PATH", help: "Override the control socket path of the board file."),
        Command.Option("tcp", value: "HOST:PORT", help: "Override the TCP listen address of the board file (port 0 picks a free one)."),
        Command.Option("log-level", value: "LEVEL", help: "trace, debug, info, notice, warning, error or critical (default info)."),
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
    if configuration.lockMemory, mlockall(MCL_CURRENT | MCL_FUTURE) != 0 {
        // Page faults on the servo path would be latency nobody asked for.
        logger.warning("lock_memory: mlockall failed (\(String(cString: strerror(errno)))); raise LimitMEMLOCK or run as root")
    }

    let runtime: BoardRuntime
    do {
        runtime = try BoardRuntime(configuration: configuration, logger: logger, controlSocketPath: arguments.option("control-socket"))
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

Command(
    "blecontrold",
    abstract: "BLEControl board firmware.",
    subcommands: [run, safeOutputs],
    defaultSubcommand: "run"
).main(version: BLEControlVersion.string)
