import Board
import Control
import Reactor

/// Home Assistant's MQTT discovery for one board: the retained
/// `PREFIX/COMPONENT/NODE/OBJECT/config` messages that make the board one
/// device with an entity per output (Home Assistant's documentation,
/// "MQTT Discovery", and the pages of the number, switch, text and
/// binary_sensor platforms). Pure: the transport publishes what this says.
///
/// Every entity reads the board's one retained status (`…/status`); its
/// template finds its own output there and yields `None` (Home Assistant's
/// "unknown") when the output is not in it (a status from before a reload
/// that added it) or was never commanded, so no template can fail on a
/// status it did not expect.
public struct MQTTDiscovery: Sendable, Equatable {
    /// One entity's config topic and payload.
    public struct Entity: Sendable, Equatable {
        public var topic: String
        public var payload: [UInt8]
    }

    /// What the device page shows of the hardware.
    public struct Hardware: Sendable, Equatable {
        /// "Raspberry Pi 4 Model B Rev 1.4" (the device tree's model), or
        /// what the board is without one.
        public var model: String
        /// The board's serial number (the device tree's), if it has one.
        public var serial: String?

        public init(model: String, serial: String? = nil) {
            self.model = model
            self.serial = serial
        }

        /// This machine's, from the device tree (/proc/device-tree/model
        /// and serial-number, NUL-terminated strings); `fallback` where
        /// there is none (a PC, the simulator).
        public static func fromDeviceTree(root: String = "/proc/device-tree", fallback: String) -> Hardware {
            func text(_ name: String) -> String? {
                guard let bytes = try? Files.read("\(root)/\(name)", limit: 256) else { return nil }
                let value = String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self).trimmed
                return value.isEmpty ? nil : value.escaped(maximumLength: 80)
            }
            return Hardware(model: text("model") ?? fallback, serial: text("serial-number"))
        }
    }

    /// The node id: one per board, in every entity's topic and unique id.
    public let node: String
    public let entities: [Entity]

    /// Icons (Material Design Icons, as Home Assistant names them).
    enum Icon {
        static let servo = "mdi:axis-arrow"
        static let esc = "mdi:engine"
        static let pwm = "mdi:square-wave"
        static let enable = "mdi:power"
        static let toggle = "mdi:toggle-switch-outline"
        static let text = "mdi:card-text-outline"
        static let transition = "mdi:timer-outline"
    }

    public init(configuration: BoardConfiguration, topics: MQTTTopics, prefix: String, version: String, hardware: Hardware, configurationURL: String? = nil) {
        let node = "blecontrol_\(topics.board)"
        self.node = node
        var deviceFields: [(String, JSONValue)] = [
            ("identifiers", .array([.string(node)])),
            ("name", .string(configuration.name)),
            ("manufacturer", .string("BLEControl for Linux")),
            ("model", .string(hardware.model)),
            ("sw_version", .string(version)),
        ]
        if let serial = hardware.serial { deviceFields.append(("serial_number", .string(serial))) }
        if let configurationURL { deviceFields.append(("configuration_url", .string(configurationURL))) }
        let device: JSONValue = .object(deviceFields)
        let origin: JSONValue = .object([("name", .string("BLEControl for Linux")), ("sw_version", .string(version))])
        func entity(_ component: String, _ object: String, _ name: String, icon: String?, category: String? = nil, _ fields: [(String, JSONValue)]) -> Entity {
            var common: [(String, JSONValue)] = [
                ("name", .string(name)),
                ("unique_id", .string("\(node)_\(object)")),
                ("availability_topic", .string(topics.availability)),
                ("device", device),
                ("origin", origin),
            ]
            if let icon { common.append(("icon", .string(icon))) }
            if let category { common.append(("entity_category", .string(category))) }
            return Entity(topic: "\(prefix)/\(component)/\(node)/\(object)/config", payload: JSONValue.object(common + fields).serialized())
        }
        /// A template that finds entry `number` of `list` (matched on
        /// `key`) in the status and renders `expression` of it (`c` is the
        /// entry), or `missing` when there is no such entry: a template
        /// that never fails on a status without it.
        func find(_ list: String, _ key: String, _ number: Int, _ expression: String, missing: String) -> String {
            "{% set c = (value_json.get('\(list)') or []) | selectattr('\(key)', 'equalto', \(number)) | list | first | default(none) %}"
                + "{{ \(missing) if c is none else \(expression) }}"
        }
        func decimal(_ value: Double) -> String { value == value.rounded() ? "\(Int(value))" : value.fixed(1) }
        let onOff: [(String, JSONValue)] = [("payload_on", .string("ON")), ("payload_off", .string("OFF")),
                                           ("state_on", .string("ON")), ("state_off", .string("OFF"))]
        var entities: [Entity] = []
        for item in configuration.servo?.channels ?? [] {
            let number = item.channel
            switch item.role {
            case .servo, .esc:
                // In µs, over the channel's calibrated range; the board turns
                // a pulse into the SERVO_VAL that gives it (…/pulse/N/set).
                let low = min(item.minimum.value, item.maximum.value), high = max(item.minimum.value, item.maximum.value)
                entities.append(entity("number", "servo_\(number)", item.displayName, icon: item.role == .esc ? Icon.esc : Icon.servo, [
                    ("command_topic", .string("\(topics.base)/pulse/\(number)/set")),
                    ("state_topic", .string(topics.status)),
                    ("value_template", .string(find("channels", "channel", number, "c.get('setpoint_us') if c.get('setpoint_us') is not none else 'None'", missing: "'None'"))),
                    // Home Assistant's own spelling (UnitOfTime.MICROSECONDS,
                    // GREEK SMALL LETTER MU): it rewrites the micro sign to it.
                    ("unit_of_measurement", .string("\u{03BC}s")),
                    ("min", .number(decimal(low))), ("max", .number(decimal(high))), ("step", .number("1")),
                    ("mode", .string("slider")),
                ]))
                // Where the servo has got to (the number above is where it
                // is going), with its motion as attributes.
                entities.append(entity("sensor", "position_\(number)", "\(item.displayName) position", icon: item.role == .esc ? Icon.esc : Icon.servo,
                                       category: "diagnostic", [
                    ("state_topic", .string(topics.status)),
                    ("value_template", .string(find("channels", "channel", number, "c.pulse_us", missing: "'None'"))),
                    ("unit_of_measurement", .string("\u{03BC}s")),
                    ("state_class", .string("measurement")),
                    ("json_attributes_topic", .string(topics.status)),
                    ("json_attributes_template", .string(find("channels", "channel", number,
                        "{'moving': c.get('moving', false), 'setpoint_us': c.get('setpoint_us'), 'released': c.get('released', false)} | tojson",
                        missing: "{} | tojson"))),
                ]))
                // The move's time for the commands that give none: Home
                // Assistant's number, a user's automation.
                entities.append(entity("number", "transition_\(number)", "\(item.displayName) transition", icon: Icon.transition, category: "config", [
                    ("command_topic", .string("\(topics.base)/transition/\(number)/set")),
                    ("state_topic", .string(topics.transition(number))),
                    ("unit_of_measurement", .string("s")),
                    ("min", .number("0")), ("max", .number("\(Int(MQTTTopics.maximumTransition))")), ("step", .number("0.1")),
                    ("mode", .string("box")),
                ]))
            case .pwm:
                entities.append(entity("number", "pwm_\(number)", item.displayName, icon: Icon.pwm, [
                    ("command_topic", .string("\(topics.base)/pwm/\(number)/set")),
                    // PWM_VAL counts tenths of a percent.
                    ("command_template", .string("{{ (value * 10) | round(0) | int }}")),
                    ("state_topic", .string(topics.status)),
                    ("value_template", .string(find("channels", "channel", number, "c.get('setpoint_percent') if c.get('setpoint_percent') is not none else 'None'", missing: "'None'"))),
                    ("unit_of_measurement", .string("%")),
                    ("min", .number("0")), ("max", .number("100")), ("step", .number("0.1")), ("mode", .string("slider")),
                ]))
            }
            entities.append(entity("switch", "enable_\(number)", "\(item.displayName) output", icon: Icon.enable, category: "config", [
                ("command_topic", .string("\(topics.base)/enable/\(number)/set")),
                ("state_topic", .string(topics.status)),
                ("value_template", .string(find("channels", "channel", number, "'ON' if c.enabled else 'OFF'", missing: "'None'"))),
            ] + onOff))
        }
        for item in configuration.switches {
            entities.append(entity("switch", "switch_\(item.index)", item.displayName, icon: Icon.toggle, [
                ("command_topic", .string("\(topics.base)/switch/\(item.index)/set")),
                ("state_topic", .string(topics.status)),
                ("value_template", .string(find("switches", "switch", item.index, "'ON' if c.on else 'OFF'", missing: "'None'"))),
            ] + onOff))
        }
        if let lcd = configuration.lcd {
            for row in 0..<lcd.rows {
                entities.append(entity("text", "lcd_\(row)", lcd.lineName(row), icon: Icon.text, [
                    ("command_topic", .string("\(topics.base)/lcd/\(row)/set")),
                    ("state_topic", .string(topics.status)),
                    ("value_template", .string(
                        "{% set lines = (value_json.get('lcd') or {}).get('lines') or [] %}{{ lines[\(row)] | trim if lines | length > \(row) else '' }}")),
                    ("min", .number("0")), ("max", .number("\(lcd.columns)")),
                ]))
            }
        }
        entities.append(entity("binary_sensor", "failsafe", "Failsafe", icon: nil, category: "diagnostic", [
            ("state_topic", .string(topics.failsafe)),
            ("payload_on", .string("ON")), ("payload_off", .string("OFF")),
            ("device_class", .string("problem")),
            // Why it holds (or held last), from the status.
            ("json_attributes_topic", .string(topics.status)),
            ("json_attributes_template", .string("{{ {'reason': (value_json.get('servo') or {}).get('failsafe')} | tojson }}")),
        ]))
        self.entities = entities
    }

    /// The filter that finds this board's configs on the broker, its own
    /// from an earlier run included (retained).
    public static func filter(prefix: String, node: String) -> String { "\(prefix)/+/\(node)/+/config" }
}
