import ArgumentParser
import Firmware
import Foundation
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The BLEControl board daemon: `run` (the default) and `safe-outputs`.
struct Daemon: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blecontrold",
        abstract: "BLEControl board firmware.",
        version: BLEControlVersion.string,
        subcommands: [Run.self, SafeOutputs.self],
        defaultSubcommand: Run.self
    )
}

/// Reads the board file named by --board, or the built-in simulator board;
/// a bad file is a message on stderr and exit status 2.
func loadBoard(_ path: String?) throws -> BoardConfiguration {
    do {
        if let path { return try BoardFile.load(path: path) }
        return try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
    } catch {
        FileHandle.standardError.write(Data("\(error)\n".utf8))
        throw ExitCode(2)
    }
}

func bootstrapLogging(_ level: Logger.Level) {
    LoggingSystem.bootstrap { label in
        var handler = StreamLogHandler.standardError(label: label)
        handler.logLevel = level
        return handler
    }
}

/// After a crash (`kill -9`, a fault), the chip keeps producing the last
/// pulses: systemd runs this from ExecStopPost= to switch them off.
struct SafeOutputs: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "safe-outputs",
        abstract: "Switch every PCA9685 output off with one write and exit (for ExecStopPost=)."
    )

    @Option(name: .long, help: "Board file (YAML). Default: the built-in simulator board.")
    var board: String?

    func run() throws {
        bootstrapLogging(.warning)
        let configuration = try loadBoard(board)
        do {
            print(try BoardBuses.safeOutputs(configuration, logger: Logger(label: "blecontrold")))
        } catch {
            FileHandle.standardError.write(Data("safe-outputs: \(error)\n".utf8))
            throw ExitCode(1)
        }
    }
}

/// Runs the board.
struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "BLEControl board firmware: drives servos, ESCs, PWM outputs, a character LCD and a status LED from BLEControl frames.",
        discussion: """
        With no --board, runs the built-in simulator board (emulated PCA9685, 16×2 LCD and LED; \
        TCP on 127.0.0.1:7171). Exit status 2: the board file or the arguments are wrong.
        """
    )

    @Option(name: .long, help: "Board file (YAML). Default: the built-in simulator board.")
    var board: String?

    @Option(name: .long, help: "Override the control socket path of the board file.")
    var controlSocket: String?

    @Option(name: .long, help: "Override the TCP listen address of the board file (HOST:PORT; port 0 picks a free one).")
    var tcp: String?

    @Option(name: .long, help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: String = "info"

    @Flag(name: .long, help: "Validate the board file and exit.")
    var checkBoard = false

    func validate() throws {
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        if let tcp, TCPConfiguration(endpoint: tcp) == nil {
            throw ValidationError("--tcp must be HOST:PORT (e.g. 127.0.0.1:7171 or [::1]:0), got \(tcp)")
        }
    }

    func run() throws {
        bootstrapLogging(Logger.Level(rawValue: logLevel) ?? .info)
        let logger = Logger(label: "blecontrold")
        let configuration = try loadBoard(board)
        if checkBoard {
            print("\(configuration.sourcePath): OK (\(configuration.name))")
            return
        }
        if configuration.lockMemory {
            // Page faults on the servo path would be latency nobody asked for.
            if mlockall(MCL_CURRENT | MCL_FUTURE) != 0 {
                logger.warning("lock_memory: mlockall failed (\(String(cString: strerror(errno)))); raise LimitMEMLOCK or run as root")
            }
        }

        let runtime: BoardRuntime
        do {
            runtime = try BoardRuntime(configuration: configuration, logger: logger)
            try runtime.start(controlSocketPath: controlSocket, tcpOverride: tcp.flatMap(TCPConfiguration.init(endpoint:)).map { ($0.host, $0.port) })
        } catch {
            logger.critical("cannot start: \(error)")
            throw ExitCode(1)
        }
        logger.notice("board \"\(configuration.name)\" running")

        // SIGTERM/SIGINT: stop in reverse start order (outputs off last), then exit 0.
        let stopped = DispatchSemaphore(value: 0)
        var sources: [DispatchSourceSignal] = []
        for signalNumber in [SIGTERM, SIGINT] {
            signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
            source.setEventHandler {
                logger.notice("signal \(signalNumber): stopping")
                stopped.signal()
            }
            source.resume()
            sources.append(source)
        }
        // A client vanishing mid-write must not kill the daemon.
        signal(SIGPIPE, SIG_IGN)
        stopped.wait()
        runtime.stop()
        logger.notice("stopped; every output off")
    }
}

Daemon.main()
