import DBus

/// How writes to FFE1 are protected (the board file's `ble.security`).
public enum BLESecurity: String, Sendable, CaseIterable {
    /// Anyone may write, as the original HM-10 board.
    case open
    /// Writes need an encrypted link (BlueZ pairs "just works" on demand).
    case encrypted
    /// Writes need an authenticated (MITM-protected) encrypted link.
    case authenticated

    /// The IO capability of the pairing agent the board registers as
    /// bluetoothd's default, nil for none. bluetoothd asks the default
    /// agent to authorise every pairing a central starts, Just Works
    /// included (its "No agent available" otherwise fails the pairing,
    /// and without an agent the adapter does not bond either), so
    /// `encrypted` needs one as much as `authenticated`. DisplayOnly:
    /// passkey entry, the MITM-protected method a display-only device has
    /// (Core 5.3 Vol 3 Part H 2.3.5.1, Table 2.8); NoInputNoOutput: Just
    /// Works.
    public var agentCapability: String? {
        switch self {
        case .open: return nil
        case .encrypted: return "NoInputNoOutput"
        case .authenticated: return "DisplayOnly"
        }
    }
}

// The peripheral's public vocabulary: its configuration, what it tells its
// owner, and what it reports. The behaviour is in BLEPeripheral.swift.
extension BLEPeripheral {
    public typealias Security = BLESecurity

    public struct Configuration: Sendable {
        /// The advertised complete local name.
        public var name: String
        /// `hci0`, …
        public var adapter: String
        /// Switch the adapter on when it is off.
        public var powerOn: Bool
        public var security: Security
        /// Bluetooth addresses (`AA:BB:CC:DD:EE:FF`) allowed to write; empty: anyone.
        public var allow: [String]
        /// Device Information service strings.
        public var manufacturer: String
        public var model: String
        public var firmwareRevision: String
        /// The bus address (default: the system bus, honouring DBUS_SYSTEM_BUS_ADDRESS).
        public var busAddress: String?
        /// Offer `AcquireWrite` (the `WriteAcquired` property). Once a socket
        /// is acquired bluetoothd sends every FFE1 write through it, write
        /// requests included, and answers those at once (gatt-database.c,
        /// chrc_write_cb): faster, but a write with response is then
        /// acknowledged before it is applied.
        public var acquireWrite: Bool
        /// Offer write-without-response on FFE1 (the HM-10 layout the
        /// original app expects). Without it bluetoothd waits for our reply
        /// to every write, so each acknowledgement means "applied".
        public var writeWithoutResponse: Bool
        /// Set the adapter's Alias (the GAP name iOS shows in its device
        /// list) to `name`, restoring the previous alias on stop.
        public var setAlias: Bool
        /// How long the fast advertising interval lasts after the board
        /// comes on the air and after its last central leaves
        /// (``AdvertisingInterval``).
        public var fastAdvertisingPeriod: Duration

        public init(name: String, adapter: String = "hci0", powerOn: Bool = true, security: Security = .open, allow: [String] = [],
                    manufacturer: String = "BLEControl", model: String = "BLEControl board", firmwareRevision: String = "0.1.0",
                    busAddress: String? = nil, acquireWrite: Bool = false, writeWithoutResponse: Bool = true, setAlias: Bool = false,
                    fastAdvertisingPeriod: Duration = .seconds(30)) {
            self.name = name
            self.adapter = adapter
            self.powerOn = powerOn
            self.security = security
            self.allow = allow
            self.manufacturer = manufacturer
            self.model = model
            self.firmwareRevision = firmwareRevision
            self.busAddress = busAddress
            self.acquireWrite = acquireWrite
            self.writeWithoutResponse = writeWithoutResponse
            self.setAlias = setAlias
            self.fastAdvertisingPeriod = fastAdvertisingPeriod
        }
    }

    /// The advertising interval, as Apple's Accessory Design Guidelines
    /// (Bluetooth, "Advertising Interval") ask of an accessory: 20 ms for
    /// the first 30 s, so a phone finds it at once, then one of their
    /// longer intervals (152.5 ms to 211.25 ms) to save power and air time.
    /// The board goes fast again whenever its last central leaves (the app
    /// is likely coming back). bluetoothd takes these from the
    /// advertisement's MinInterval/MaxInterval (milliseconds): from 5.77
    /// on (Debian 13); 5.66 (Raspberry Pi OS) reads them only when started
    /// with --experimental, and otherwise uses the kernel's default.
    public enum AdvertisingInterval: Sendable, Equatable {
        case fast
        case slow

        /// (MinInterval, MaxInterval) in milliseconds.
        public var milliseconds: (min: UInt32, max: UInt32) {
            switch self {
            case .fast: return (20, 30)
            case .slow: return (152, 211)
            }
        }
    }

    /// What the peripheral tells its owner. All run on the peripheral's loop.
    public struct Handlers: Sendable {
        /// Bytes a central wrote to FFE1, in order. `central` is its BlueZ
        /// device path. With response: call `done` once the frames are
        /// applied (nil) or failed (a reason); the ATT write is answered
        /// then. Without response `done` may be ignored. Bytes from an
        /// AcquireWrite socket always come without response (BlueZ has
        /// answered the ATT write already).
        public var write: @Sendable (_ central: String, _ bytes: [UInt8], _ withResponse: Bool, _ done: @escaping @Sendable (String?) -> Void) -> Void
        /// The central is gone (disconnected, adapter or BlueZ gone).
        public var disconnected: @Sendable (_ central: String) -> Void
        /// Pairing with `ble.security: authenticated`: show `passkey` (six
        /// digits, or a legacy PIN code); nil when pairing ended.
        public var passkey: @Sendable (_ central: String, _ passkey: String?) -> Void

        public init(write: @escaping @Sendable (String, [UInt8], Bool, @escaping @Sendable (String?) -> Void) -> Void,
                    disconnected: @escaping @Sendable (String) -> Void,
                    passkey: @escaping @Sendable (String, String?) -> Void = { _, _ in }) {
            self.write = write
            self.disconnected = disconnected
            self.passkey = passkey
        }
    }

    /// Counters for status.
    public struct Statistics: Sendable, Equatable {
        public var registrations = 0
        public var writes = 0
        /// Writes refused by the allow-list.
        public var refused = 0
        /// Calls refused because they did not come from bluetoothd.
        public var deniedCallers = 0
        /// Signals dropped because they did not come from the bus daemon or
        /// bluetoothd, whose signals they imitated.
        public var spoofedSignals = 0
        /// Writes refused as longer than an ATT value can be.
        public var oversized = 0
        /// Writes refused because bluetoothd does not report the device connected.
        public var unknownDevices = 0
        public var notifications = 0
    }

    /// Where the peripheral stands, for status.
    public enum State: Sendable, Equatable {
        case stopped
        /// Not on the air, and why (no bus, no BlueZ, no adapter, …).
        case unavailable(String)
        /// On its way (registering, powering the adapter on, …).
        case starting(String)
        case advertising
    }

    /// A snapshot for status.
    public struct Status: Sendable, Equatable {
        public var state: State
        public var centrals: Int
        public var statistics: Statistics
        /// The passkey on display while a central pairs (`ble.security:
        /// authenticated`), so a board without an LCD shows it in status.
        public var passkey: String? = nil
    }

    public static let serviceUUID = GATTObjects.serviceUUID
    public static let characteristicUUID = GATTObjects.characteristicUUID
    public static let applicationPath = GATTObjects.applicationPath
    public static let characteristicPath = GATTObjects.characteristicPath
    public static let advertisementPath = GATTObjects.advertisementPath
    public static let agentPath = GATTObjects.agentPath
    /// The longest attribute value (Core 5.3 Vol 3 Part F 3.2.9).
    public static let maximumWriteLength = 512

    /// Why ``forgetBonds(_:)`` could not finish.
    public struct BondFailure: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }
}
