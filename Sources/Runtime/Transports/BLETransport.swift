import Board
import BlueZ
import Firmware
import Logging
import Reactor

/// BLEControl frames over BLE, through BlueZ on the system bus: each central
/// (keyed by its BlueZ device path) is a session; ERROR replies go back as
/// FFE1 notifications. The D-Bus side lives on its own loop
/// (``BLEPeripheral``); bytes hop to the event loop with `loop.execute`, so
/// they keep their order and the event loop never waits for D-Bus.
public final class BLETransport: @unchecked Sendable {
    // `sessions` is loop-confined (touched only inside `loop.execute` or on
    // the loop); `peripheral` and the restart queue are under `lifecycle`,
    // and the peripheral is Sendable, which makes the unchecked Sendable
    // sound.
    private let loop: EventLoop
    private let hub: SessionHub
    private let dispatcher: Dispatcher
    private let logger: Logger
    private let lifecycle = Lock()
    private var current: BLEPeripheral?
    private var sessions: [String: Session] = [:]
    /// The newest restart asked for and not yet begun (reloads coalesce).
    private var pendingRestart: Restart?
    /// Whether the one restart worker is running.
    private var restarting = false
    /// Stopped for good (the daemon is stopping): no restart starts BLE again.
    private var shutDown = false
    /// A pairing passkey to show (nil: pairing over), on the loop. The
    /// runtime puts it on the LCD: the transport writes to no device.
    public var onPasskey: ((String?) -> Void)?

    private struct Restart {
        var configuration: BLEConfiguration
        var boardName: String
        var version: String
        var done: @Sendable (String?) -> Void
    }

    private var peripheral: BLEPeripheral? { lifecycle.withLock { current } }

    public init(loop: EventLoop, hub: SessionHub, dispatcher: Dispatcher, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.dispatcher = dispatcher
        self.logger = logger
    }

    /// Starts advertising through BlueZ (from any thread). Never fails: no
    /// bus or no BlueZ is a state shown in status, and is retried.
    public func start(configuration: BLEConfiguration, boardName: String, version: String) throws {
        let peripheralConfiguration = BLEPeripheral.Configuration(
            name: configuration.name, adapter: configuration.adapter, powerOn: configuration.powerOn, security: BLESecurity(configuration.security),
            allow: configuration.allow, manufacturer: "BLEControl", model: boardName, firmwareRevision: version,
            acquireWrite: configuration.acquireWrite, writeWithoutResponse: !configuration.acknowledgedWrites,
            setAlias: configuration.setAlias
        )
        let handlers = BLEPeripheral.Handlers(
            write: { [weak self] central, bytes, withResponse, done in
                guard let self else { return done("shutting down") }
                self.loop.execute { self.received(bytes, from: central, withResponse: withResponse, done: done) }
            },
            disconnected: { [weak self] central in
                guard let self else { return }
                self.loop.execute { self.closeSession(central) }
            },
            passkey: { [weak self] _, passkey in
                guard let self else { return }
                self.loop.execute { self.onPasskey?(passkey) }
            }
        )
        let peripheral = try BLEPeripheral(configuration: peripheralConfiguration, handlers: handlers, logger: logger)
        // Not kept (nor started) once the daemon is stopping.
        let keep = lifecycle.withLock { () -> Bool in
            guard !shutDown, current == nil else { return false }
            current = peripheral
            return true
        }
        if keep { peripheral.start() }
    }

    /// Stops BLE and starts it again with `configuration` (a reload), on
    /// the one restart thread: restarts never overlap, and one asked for
    /// during another runs after it, coalesced with any others (the newest
    /// configuration wins; `done` of a coalesced one is not called). `done`
    /// gets nil or the error, on the restart thread. From any thread.
    public func restart(configuration: BLEConfiguration, boardName: String, version: String, done: @escaping @Sendable (String?) -> Void) {
        let startWorker = lifecycle.withLock { () -> Bool in
            guard !shutDown else { return false }
            pendingRestart = Restart(configuration: configuration, boardName: boardName, version: version, done: done)
            guard !restarting else { return false }
            restarting = true
            return true
        }
        guard startWorker else { return }
        // Detached: nobody joins it, and a joinable thread's stack stays
        // mapped until a join (it did: one stack per BLE reload, issue #29).
        // It does what the D-Bus loop's callers do: a loop's stack.
        OSThread(name: "blecontrol-reload", stackSize: EventLoop.stackSize).start(detached: true) { [self] in
            while let job = lifecycle.withLock({ () -> Restart? in
                let job = shutDown ? nil : pendingRestart
                pendingRestart = nil
                if job == nil { restarting = false }
                return job
            }) {
                stopPeripheral()
                var failure: String?
                if job.configuration.enabled {
                    do {
                        try start(configuration: job.configuration, boardName: job.boardName, version: job.version)
                    } catch {
                        failure = "\(error)"
                    }
                }
                job.done(failure)
            }
        }
    }

    /// Unregisters from BlueZ and ends every BLE session, for good: a
    /// restart asked for later does nothing (the daemon is stopping). Call
    /// off the loop, or on it: the sessions close on the loop either way.
    public func stop() {
        lifecycle.withLock { shutDown = true }
        stopPeripheral()
    }

    private func stopPeripheral() {
        let stopping = lifecycle.withLock { () -> BLEPeripheral? in
            defer { current = nil }
            return current
        }
        stopping?.stop()
        let close: @Sendable () -> Void = { [self] in
            for central in sessions.keys.sorted() { closeSession(central) }
        }
        if loop.inLoop { close() } else { loop.execute(close) }
    }

    /// Removes every bond of the board's adapter (``BLEPeripheral/forgetBonds(_:)``).
    public func forgetBonds(_ completion: @escaping @Sendable (Result<[String], any Error>) -> Void) {
        guard let peripheral else { return completion(.failure(BLEPeripheral.BondFailure(description: "BLE is stopped"))) }
        peripheral.forgetBonds { result in completion(result.mapError { $0 }) }
    }

    /// For status: what the BLE side is doing.
    public var stateDescription: String { peripheral?.stateDescription ?? "stopped" }
    public var status: BLEPeripheral.Status? { peripheral?.status }

    // MARK: Loop

    private func received(_ bytes: [UInt8], from central: String, withResponse: Bool, done: @escaping @Sendable (String?) -> Void) {
        let session: Session
        if let existing = sessions[central] {
            session = existing
        } else {
            let peripheral = self.peripheral
            session = hub.open(transport: .ble, peer: central) { frame in
                peripheral?.notify(frame, central: central)
            }
            sessions[central] = session
        }
        let mark = dispatcher.mark
        hub.receive(bytes, for: session)
        // A write with response is acknowledged once the frames it carried
        // reached the hardware (docs/protocol.md "Transport"); ERROR replies went
        // out as notifications already.
        if withResponse { dispatcher.whenApplied(since: mark, done) } else { done(nil) }
    }

    private func closeSession(_ central: String) {
        guard let session = sessions.removeValue(forKey: central) else { return }
        hub.close(session)
    }
}

extension BLESecurity {
    /// The board file's `ble.security` in BlueZ's terms (the same three
    /// levels).
    init(_ security: BLEConfiguration.Security) {
        switch security {
        case .open: self = .open
        case .encrypted: self = .encrypted
        case .authenticated: self = .authenticated
        }
    }
}
