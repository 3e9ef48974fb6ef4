import Board
import BlueZ
import Logging
import Reactor

/// BLEControl frames over BLE, through BlueZ on the system bus: each central
/// (keyed by its BlueZ device path) is a session; ERROR replies go back as
/// FFE1 notifications. The D-Bus side lives on its own loop
/// (``BLEPeripheral``); bytes hop to the event loop with `loop.execute`, so
/// they keep their order and the event loop never waits for D-Bus.
public final class BLETransport: @unchecked Sendable {
    // `sessions` is loop-confined (touched only inside `loop.execute` or on
    // the loop), and the peripheral is Sendable, which makes the unchecked
    // Sendable sound.
    private let loop: EventLoop
    private let hub: SessionHub
    private let dispatcher: Dispatcher
    private let logger: Logger
    private var peripheral: BLEPeripheral?
    private var sessions: [String: Session] = [:]
    /// A pairing passkey to show (nil: pairing over), on the loop. The
    /// runtime puts it on the LCD: the transport writes to no device.
    public var onPasskey: ((String?) -> Void)?

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
            name: configuration.name, adapter: configuration.adapter, powerOn: configuration.powerOn, security: configuration.security,
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
        self.peripheral = peripheral
        peripheral.start()
    }

    /// Unregisters from BlueZ and ends every BLE session (call off the loop,
    /// or on it: the sessions close on the loop either way).
    public func stop() {
        peripheral?.stop()
        peripheral = nil
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
        hub.receive(bytes, for: session)
        // A write with response is acknowledged once the frames it carried
        // reached the hardware (docs/protocol.md "Transport"); ERROR replies went
        // out as notifications already.
        if withResponse { dispatcher.whenApplied(done) } else { done(nil) }
    }

    private func closeSession(_ central: String) {
        guard let session = sessions.removeValue(forKey: central) else { return }
        hub.close(session)
    }
}
