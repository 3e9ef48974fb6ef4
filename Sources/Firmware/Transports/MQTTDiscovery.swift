import Board
import Control

/// Home Assistant's MQTT discovery for one board: the retained
/// `PREFIX/COMPONENT/NODE/OBJECT/config` messages that make the board one
/// device with an entity per output (Home Assistant's documentation,
/// "MQTT Discovery", and the pages of the number, switch, text and
/// binary_sensor platforms). Pure: the transport publishes what this says.
public struct MQTTDiscovery: Sendable, Equatable {
    /// One entity's config topic and payload.
    public struct Entity: Sendable, Equatable {
        public var topic: String
        public var payload: [UInt8]
    }

    /// The node id: one per board, in every entity's topic and unique id.
    public let node: String
    public let entities: [Entity]

    public init(configuration: BoardConfiguration, topics: MQTTTopics, prefix: String, version: String) {
        let node = "blecontrol_\(topics.board)"
        self.node = node
        let device: JSONValue = .object([
            ("identifiers", .array([.string(node)])),
            ("name", .string(configuration.name)),
            ("manufacturer", .string("BLEControl for Linux")),
            ("model", .string("BLEControl board")),
            ("sw_version", .string(version)),
        ])
        func entity(_ component: String, _ object: String, _ name: String, _ fields: [(String, JSONValue)]) -> Entity {
            let common: [(String, JSONValue)] = [
                ("name", .string(name)),
                ("unique_id", .string("\(node)_\(object)")),
                ("availability_topic", .string(topics.availability)),
                ("device", device),
            ]
            return Entity(topic: "\(prefix)/\(component)/\(node)/\(object)/config", payload: JSONValue.object(common + fields).serialized())
        }
        /// A channel's entry in the status, for value templates.
        func channel(_ number: Int) -> String {
            "(value_json.channels | selectattr('channel', 'equalto', \(number)) | first)"
        }
        let onOff: [(String, JSONValue)] = [("payload_on", .string("ON")), ("payload_off", .string("OFF")),
                                           ("state_on", .string("ON")), ("state_off", .string("OFF"))]
        var entities: [Entity] = []
        for item in configuration.servo?.channels ?? [] {
            let number = item.channel
            let kind = item.role == .pwm ? "pwm" : "servo"
            entities.append(entity("number", "\(kind)_\(number)", "Channel \(number) (\(item.role))", [
                ("command_topic", .string("\(topics.base)/\(kind)/\(number)/set")),
                ("state_topic", .string(topics.status)),
                ("value_template", .string("{{ \(channel(number)).value | default(0) }}")),
                ("min", .number("0")), ("max", .number("1000")), ("step", .number("1")), ("mode", .string("slider")),
            ]))
            entities.append(entity("switch", "enable_\(number)", "Channel \(number) enabled", [
                ("command_topic", .string("\(topics.base)/enable/\(number)/set")),
                ("state_topic", .string(topics.status)),
                ("value_template", .string("{{ 'ON' if \(channel(number)).enabled else 'OFF' }}")),
            ] + onOff))
        }
        for item in configuration.switches {
            entities.append(entity("switch", "switch_\(item.index)", "Switch \(item.index)", [
                ("command_topic", .string("\(topics.base)/switch/\(item.index)/set")),
                ("state_topic", .string(topics.status)),
                ("value_template", .string("{{ 'ON' if (value_json.switches | selectattr('switch', 'equalto', \(item.index)) | first).on else 'OFF' }}")),
            ] + onOff))
        }
        if let lcd = configuration.lcd {
            for row in 0..<lcd.rows {
                entities.append(entity("text", "lcd_\(row)", "LCD line \(row)", [
                    ("command_topic", .string("\(topics.base)/lcd/\(row)/set")),
                    ("state_topic", .string(topics.status)),
                    ("value_template", .string("{{ value_json.lcd.lines[\(row)] | trim }}")),
                    ("min", .number("0")), ("max", .number("\(lcd.columns)")),
                ]))
            }
        }
        entities.append(entity("binary_sensor", "failsafe", "Failsafe", [
            ("state_topic", .string(topics.failsafe)),
            ("payload_on", .string("ON")), ("payload_off", .string("OFF")),
            ("device_class", .string("problem")),
        ]))
        self.entities = entities
    }

    /// The filter that finds this board's configs on the broker, its own
    /// from an earlier run included (retained).
    public static func filter(prefix: String, node: String) -> String { "\(prefix)/+/\(node)/+/config" }
}
