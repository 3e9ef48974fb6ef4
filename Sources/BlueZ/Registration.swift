import DBus

/// The steps that put the board on the air through BlueZ, as an explicit
/// state machine: events in (the bus, bluetoothd's name, the adapter, call
/// results, timers), actions out (connect, a D-Bus call, a retry timer, end
/// the sessions). It does no I/O and reads no clock, so every path through
/// it (bluetoothd restarting mid-registration, the adapter powered off, a
/// call failing) is tested by feeding events (Tests/BlueZTests).
///
/// Calls carry the generation they were made in; a result from an earlier
/// generation (bluetoothd restarted since) is ignored, so a slow reply can
/// never mark a registration that the new bluetoothd does not have.
struct Registration: Sendable {
    struct Options: Sendable, Equatable {
        var adapter: String
        var powerOn: Bool
        /// Register our pairing agent first, with this IO capability:
        /// DisplayOnly (`ble.security: authenticated`), NoInputNoOutput
        /// (`encrypted`), none (`open`).
        var agent: String?
        /// Set the adapter's Alias (the GAP name iOS lists) to this, restoring it on stop.
        var alias: String?
    }

    /// What bluetoothd told us about the adapter.
    struct Adapter: Sendable, Equatable {
        var powered: Bool
        var hasGATT: Bool
        var hasAdvertising: Bool
        var alias: String?
    }

    enum Phase: Sendable, Equatable {
        case stopped
        case connectingBus
        case waitingForBlueZ
        case inspecting
        case waitingForAdapter
        case adapterOff
        case poweringOn
        case settingAlias
        case registeringAgent
        case requestingDefaultAgent
        case registeringApplication
        case registeringAdvertisement
        case advertising
    }

    enum Call: Sendable, Equatable {
        case inspect
        case powerOn
        case setAlias(String)
        case registerAgent
        case requestDefaultAgent
        case registerApplication
        case registerAdvertisement
        /// Withdraw the advertisement to register it again (new intervals).
        case unregisterAdvertisement
    }

    enum Action: Sendable, Equatable {
        case connectBus
        case call(Call, generation: Int)
        /// Feed `.retry(generation)` back after the delay.
        case retry(after: Duration, generation: Int)
        /// bluetoothd forgot us (or went away): every central is gone too.
        case dropSessions
        /// A line for status and the log.
        case report(String)
        /// The advertisement bluetoothd holds carries the properties as they
        /// are now: no change of them is waiting to be registered.
        case onAir
    }

    enum Event: Sendable, Equatable {
        case start
        case stop
        case busConnected
        case busConnectFailed(String)
        case busLost
        case bluezAppeared(owner: String)
        case bluezGone
        case adapterAdded
        case adapterRemoved
        case adapterPowered(Bool)
        case inspected(Adapter?, generation: Int)
        case succeeded(Call, generation: Int)
        case failed(Call, DBusFailure, generation: Int)
        case advertisementReleased
        case agentReleased
        case retry(generation: Int)
        /// Register the advertisement again (its properties changed: the
        /// advertising interval). On the air: at once. While a registration
        /// is under way: once it stands, since bluetoothd may have read the
        /// old properties already. Otherwise ignored: the next registration
        /// reads them as they are then.
        case readvertise
    }

    let options: Options
    private(set) var phase = Phase.stopped
    private(set) var generation = 0
    /// bluetoothd's unique name: the only caller our objects answer.
    private(set) var owner: String?
    private(set) var agentRegistered = false
    private(set) var applicationRegistered = false
    private(set) var advertisementRegistered = false
    /// The alias found before ours was set (restored on stop).
    private(set) var previousAlias: String?
    private var aliasApplied = false
    /// Completed registrations (status).
    private(set) var registrations = 0
    /// Failed attempts to reach the system bus in a row: each waits twice
    /// as long as the one before (2 s up to a minute), so a machine with no
    /// system bus does not wake the daemon every 2 s for ever (issue #29).
    private var busFailures = 0
    /// Between `.readvertise` and the new advertisement's registration:
    /// still on the air as far as anyone outside can tell.
    private(set) var readvertising = false
    /// A `.readvertise` came after RegisterAdvertisement was sent:
    /// bluetoothd reads the properties while it handles that call, so the
    /// one it answers may carry the old interval (a fast period that ended,
    /// or a central that left, mid-registration).
    private var readvertisePending = false

    init(options: Options) { self.options = options }

    var isAdvertising: Bool { phase == .advertising }

    /// Whether bluetoothd may hold our advertisement: on the air,
    /// registered, or a RegisterAdvertisement sent and not answered yet. bluetoothd puts the
    /// advertisement on its list as the call arrives, but watches for its
    /// owner leaving the bus only once the kernel has taken it
    /// (src/advertising.c: register_advertisement, add_adv_callback; 5.66
    /// to 5.82). A daemon that leaves in between leaves an instance that
    /// counts in ActiveInstances until bluetoothd restarts, so stopping
    /// unregisters in this state too (the call comes after the register
    /// on the same connection: bluetoothd sees them in that order).
    var advertisementMayBeHeld: Bool { isAdvertising || advertisementRegistered || phase == .registeringAdvertisement }

    mutating func handle(_ event: Event) -> [Action] {
        switch event {
        case .start:
            guard phase == .stopped else { return [] }
            phase = .connectingBus
            return [.connectBus]
        case .stop:
            phase = .stopped
            generation += 1
            return []
        case .busConnected:
            guard phase == .connectingBus else { return [] }
            phase = .waitingForBlueZ
            busFailures = 0
            return [.report("no BlueZ on the system bus (waiting for bluetoothd): BLE off, TCP still serving")]
        case .busConnectFailed(let reason):
            guard phase == .connectingBus else { return [] }
            generation += 1
            let wait = Duration.seconds(min(2 << min(busFailures, 5), 60))
            busFailures += 1
            return [.report("no BlueZ on the system bus (\(reason)): BLE off, TCP still serving"), .retry(after: wait, generation: generation)]
        case .busLost:
            guard phase != .stopped else { return [] }
            forget()
            owner = nil
            phase = .connectingBus
            return [.dropSessions, .report("the system bus went away: BLE off, TCP still serving; reconnecting"),
                    .retry(after: .seconds(1), generation: generation)]
        case .bluezAppeared(let newOwner):
            guard phase != .stopped, phase != .connectingBus, owner != newOwner else { return [] }
            let hadOwner = owner != nil
            forget()
            owner = newOwner
            return (hadOwner ? [.dropSessions] : []) + [.report("BlueZ is on the bus (\(newOwner))")] + inspect()
        case .bluezGone:
            guard owner != nil else { return [] }
            forget()
            owner = nil
            phase = .waitingForBlueZ
            return [.dropSessions, .report("no BlueZ on the system bus: BLE off, TCP still serving")]
        case .adapterAdded:
            guard owner != nil, phase == .waitingForAdapter else { return [] }
            return inspect()
        case .adapterRemoved:
            guard owner != nil, phase != .stopped else { return [] }
            forget()
            phase = .waitingForAdapter
            return [.dropSessions, .report("waiting for adapter \(options.adapter) (it went away)"), .retry(after: .seconds(1), generation: generation)]
        case .adapterPowered(let powered):
            guard owner != nil, phase != .stopped else { return [] }
            forget()
            if powered { return [.dropSessions, .report("adapter \(options.adapter) powered on")] + inspect() }
            phase = .adapterOff
            var actions: [Action] = [.dropSessions, .report("adapter \(options.adapter) is powered off: waiting")]
            if options.powerOn { actions.append(.retry(after: .seconds(1), generation: generation)) }
            return actions
        case .inspected(let adapter, let stamp):
            guard stamp == generation, phase == .inspecting else { return [] }
            return inspected(adapter)
        case .succeeded(let call, let stamp):
            guard stamp == generation else { return [] }
            return succeeded(call)
        case .failed(let call, let failure, let stamp):
            guard stamp == generation else { return [] }
            return failed(call, failure)
        case .advertisementReleased:
            // BlueZ dropped it without being asked (adapter reset): register again.
            guard advertisementRegistered, phase != .stopped else { return [] }
            advertisementRegistered = false
            generation += 1
            phase = .inspecting
            return [.report("BlueZ released the advertisement; registering it again"), .retry(after: .milliseconds(200), generation: generation)]
        case .agentReleased:
            agentRegistered = false
            return []
        case .readvertise:
            if phase == .registeringAdvertisement {
                readvertisePending = true
                return []
            }
            guard phase == .advertising, advertisementRegistered else { return [] }
            return readvertise()
        case .retry(let stamp):
            guard stamp == generation else { return [] }
            switch phase {
            case .connectingBus: return [.connectBus]
            case .stopped, .waitingForBlueZ: return []
            default: return owner == nil ? [] : inspect()
            }
        }
    }

    /// The next step after the adapter looked fine, in order: alias,
    /// agent, application, advertisement.
    private mutating func next() -> [Action] {
        if let alias = options.alias, !aliasApplied {
            phase = .settingAlias
            return [.call(.setAlias(alias), generation: generation)]
        }
        if options.agent != nil, !agentRegistered {
            phase = .registeringAgent
            return [.report("registering the pairing agent"), .call(.registerAgent, generation: generation)]
        }
        if !applicationRegistered {
            phase = .registeringApplication
            return [.report("registering on \(options.adapter)"), .call(.registerApplication, generation: generation)]
        }
        if !advertisementRegistered {
            phase = .registeringAdvertisement
            // bluetoothd reads the properties from here on: as they are now.
            readvertisePending = false
            return [.call(.registerAdvertisement, generation: generation)]
        }
        phase = .advertising
        var actions: [Action] = []
        if readvertising {
            readvertising = false
        } else {
            registrations += 1
            actions.append(.report("advertising"))
        }
        if readvertisePending { return actions + readvertise() }
        return actions + [.onAir]
    }

    /// Withdraws the advertisement to register it again with new properties.
    private mutating func readvertise() -> [Action] {
        advertisementRegistered = false
        readvertising = true
        phase = .registeringAdvertisement
        return [.call(.unregisterAdvertisement, generation: generation)]
    }

    private mutating func inspect() -> [Action] {
        generation += 1
        phase = .inspecting
        return [.call(.inspect, generation: generation)]
    }

    private mutating func inspected(_ adapter: Adapter?) -> [Action] {
        guard let adapter else {
            phase = .waitingForAdapter
            // InterfacesAdded normally brings it; look again as well, cheaply.
            return [.report("waiting for adapter \(options.adapter)"), .retry(after: .seconds(1), generation: generation)]
        }
        guard adapter.hasGATT, adapter.hasAdvertising else {
            phase = .waitingForAdapter
            return [.report("adapter \(options.adapter) has no GATT server or LE advertising (BlueZ too old, or not LE)"),
                    .retry(after: .seconds(2), generation: generation)]
        }
        guard adapter.powered else {
            if options.powerOn {
                phase = .poweringOn
                return [.report("powering adapter \(options.adapter) on"), .call(.powerOn, generation: generation)]
            }
            phase = .adapterOff
            return [.report("adapter \(options.adapter) is powered off: waiting (ble.power_on is false)")]
        }
        if previousAlias == nil { previousAlias = adapter.alias }
        if let alias = options.alias, adapter.alias == alias { aliasApplied = true }
        return next()
    }

    private mutating func succeeded(_ call: Call) -> [Action] {
        switch call {
        case .inspect:
            return []
        case .powerOn:
            // Powered arrives as a signal too; look again shortly either way.
            return [.retry(after: .milliseconds(300), generation: generation)]
        case .setAlias:
            aliasApplied = true
        case .registerAgent:
            phase = .requestingDefaultAgent
            return [.call(.requestDefaultAgent, generation: generation)]
        case .requestDefaultAgent:
            agentRegistered = true
        case .registerApplication:
            applicationRegistered = true
        case .registerAdvertisement:
            advertisementRegistered = true
        case .unregisterAdvertisement:
            break
        }
        return next()
    }

    private mutating func failed(_ call: Call, _ failure: DBusFailure) -> [Action] {
        let alreadyThere = failure.name == "org.bluez.Error.AlreadyExists"
        switch call {
        case .inspect:
            return [.report("BlueZ does not answer GetManagedObjects (\(failure)); retrying"), .retry(after: .seconds(1), generation: generation)]
        case .powerOn:
            return [.report("cannot power adapter \(options.adapter) on: \(failure)"), .retry(after: .seconds(1), generation: generation)]
        case .setAlias:
            // The name is a nicety; never let it keep the board off the air.
            aliasApplied = true
            return [.report("cannot set the adapter's alias: \(failure)")] + next()
        case .registerAgent where alreadyThere:
            phase = .requestingDefaultAgent
            return [.call(.requestDefaultAgent, generation: generation)]
        case .registerAgent, .requestDefaultAgent:
            // Unauthenticated writes will fail, but the service still runs.
            agentRegistered = true
            return [.report("pairing agent: \(failure); pairing will fail")] + next()
        case .registerApplication where alreadyThere:
            applicationRegistered = true
            return next()
        case .registerAdvertisement where alreadyThere:
            advertisementRegistered = true
            return next()
        case .unregisterAdvertisement:
            // Gone already (DoesNotExist): registering it is what matters.
            return next()
        case .registerApplication:
            return [.report("RegisterApplication failed: \(failure); retrying"), .retry(after: .seconds(1), generation: generation)]
        case .registerAdvertisement:
            readvertising = false
            return [.report("RegisterAdvertisement failed: \(failure); retrying"), .retry(after: .seconds(1), generation: generation)]
        }
    }

    /// bluetoothd no longer has our registrations (it restarted, the adapter
    /// went or was switched off): forget them and drop late replies.
    private mutating func forget() {
        generation += 1
        readvertising = false
        agentRegistered = false
        applicationRegistered = false
        advertisementRegistered = false
        aliasApplied = false
    }
}
