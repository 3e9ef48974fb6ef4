import Hardware
import Reactor

/// The outputs a daemon really drives: the PCA9685s (bus and address) and
/// the servo output-enable line. `blecontrold run` records them at start
/// (a reload cannot change them: it refuses new buses, chips or
/// output_enable); `blecontrold safe-outputs` switches off what the record
/// says, so a board file edited since (a typo, another chip address) cannot
/// talk the crash cleanup out of its job or point it at the wrong chip.
public struct DrivenOutputs: Sendable, Equatable {
    public struct Chip: Sendable, Equatable, CustomStringConvertible {
        public var bus: BusConfiguration.Kind
        public var address: I2CAddress
        public init(bus: BusConfiguration.Kind, address: I2CAddress) {
            self.bus = bus
            self.address = address
        }
        public var description: String {
            switch bus {
            case .emulated: return "PCA9685 \(address) on an emulated bus"
            case .device(let path): return "PCA9685 \(address) on \(path)"
            case .adapter(let name): return "PCA9685 \(address) on adapter \"\(name)\""
            }
        }
    }

    /// Chips on real buses (an emulated chip does not outlive the daemon).
    public var chips: [Chip]
    /// The servo output-enable line, when it is a real GPIO line.
    public var outputEnable: LEDConfiguration?

    public init(chips: [Chip], outputEnable: LEDConfiguration?) {
        self.chips = chips
        self.outputEnable = outputEnable
    }

    /// What a parsed board file drives.
    public init(_ configuration: BoardConfiguration) {
        self.init(chips: Self.chips(configuration.servo?.chips ?? [], buses: configuration.buses),
                  outputEnable: Self.realLine(configuration.servo?.outputEnable))
    }

    static func chips(_ chips: [PCA9685Chip], buses: [String: BusConfiguration]) -> [Chip] {
        chips.compactMap { chip in
            guard let kind = buses[chip.bus]?.kind, kind != .emulated else { return nil }
            return Chip(bus: kind, address: chip.address)
        }
    }

    static func realLine(_ line: LEDConfiguration?) -> LEDConfiguration? {
        if case .gpio? = line { return line }
        return nil
    }

    // MARK: The record

    static let header = "# blecontrold: the outputs this daemon drives, written at its start; `blecontrold safe-outputs` switches them off"
    /// A record is a few lines; anything longer is not one.
    public static let maximumRecordSize = 16 << 10

    /// The record's text: one line per chip and one for the line, fields
    /// separated by tabs (adapter names contain spaces).
    public var record: String {
        var lines = [Self.header]
        for chip in chips {
            switch chip.bus {
            case .emulated: continue
            case .device(let path): lines.append("pca9685\t\(chip.address.rawValue)\tdevice\t\(path)")
            case .adapter(let name): lines.append("pca9685\t\(chip.address.rawValue)\tadapter\t\(name)")
            }
        }
        if case .gpio(let chip, let line, let lineName, let activeLow)? = outputEnable {
            let which = line.map { "line\t\($0)" } ?? "name\t\(lineName ?? "")"
            lines.append("output_enable\t\(activeLow ? "active_low" : "active_high")\t\(chip.isEmpty ? "-" : chip)\t\(which)")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    public struct RecordError: Error, CustomStringConvertible {
        public var description: String
    }

    /// Reads a record; any line it does not understand makes the whole
    /// record untrustworthy (a torn write, someone else's file).
    public static func parse(record text: String) throws(RecordError) -> DrivenOutputs {
        guard text.utf8.count <= maximumRecordSize else { throw RecordError(description: "longer than \(maximumRecordSize) bytes") }
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard lines.first == header, lines.last == "" else { throw RecordError(description: "not a complete record (header or final newline missing)") }
        lines.removeFirst()
        lines.removeLast()
        var result = DrivenOutputs(chips: [], outputEnable: nil)
        for (index, line) in lines.enumerated() {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
            let bad = RecordError(description: "line \(index + 2) not understood: \(line.prefix(80))")
            switch fields.first {
            case "pca9685":
                guard fields.count == 4, let raw = Int(fields[1]), let address = I2CAddress(raw), !fields[3].isEmpty else { throw bad }
                switch fields[2] {
                case "device" where fields[3].hasPrefix("/dev/"): result.chips.append(Chip(bus: .device(path: fields[3]), address: address))
                case "adapter": result.chips.append(Chip(bus: .adapter(name: fields[3]), address: address))
                default: throw bad
                }
            case "output_enable":
                guard fields.count == 5, result.outputEnable == nil, fields[1] == "active_low" || fields[1] == "active_high" else { throw bad }
                let chip = fields[2] == "-" ? "" : fields[2]
                switch fields[3] {
                case "line":
                    guard let number = Int(fields[4]), (0...1023).contains(number) else { throw bad }
                    result.outputEnable = .gpio(chip: chip, line: number, lineName: nil, activeLow: fields[1] == "active_low")
                case "name" where !fields[4].isEmpty:
                    result.outputEnable = .gpio(chip: chip, line: nil, lineName: fields[4], activeLow: fields[1] == "active_low")
                default: throw bad
                }
            default:
                throw bad
            }
        }
        return result
    }
}

extension BoardFile {
    /// The chips and output-enable line a board file names, read leniently:
    /// only `buses` and `servo`'s chip keys and `output_enable`; unknown keys
    /// and every other section are ignored, and a chip whose entry is wrong
    /// is left out. For the crash cleanup when there is no record: a typo
    /// elsewhere in the file must not keep it from switching chips off.
    /// `problems` lists what was left out.
    public static func drivenOutputs(leniently text: String, path: String) -> (outputs: DrivenOutputs, problems: [BoardFileError.Problem]) {
        let reader = BoardReader(path: path)
        reader.lenient = true
        let root: YAML.Node?
        do {
            root = try YAML.parse(text)
        } catch {
            return (DrivenOutputs(chips: [], outputEnable: nil), [.init(path: path, line: error.line, field: "yaml", message: error.message)])
        }
        guard let root else { return (DrivenOutputs(chips: [], outputEnable: nil), [.init(path: path, line: 1, field: "file", message: "is empty")]) }
        let (chips, buses, outputEnable) = reader.servoWiring(root)
        return (DrivenOutputs(chips: DrivenOutputs.chips(chips, buses: buses), outputEnable: DrivenOutputs.realLine(outputEnable)), reader.problems)
    }
}

extension BoardReader {
    /// The chips and output-enable line of `servo`, and the buses, without
    /// the channels or any other section (``BoardFile/drivenOutputs(leniently:path:)``).
    func servoWiring(_ root: Node) -> (chips: [PCA9685Chip], buses: [String: BusConfiguration], outputEnable: LEDConfiguration?) {
        guard let top = mapping(root, "", allowed: ["buses", "servo"]) else { return ([], [:], nil) }
        let buses = top.entries["buses"].map(busList) ?? [:]
        guard let node = top.entries["servo"], let fields = mapping(node, "servo", allowed: Set(Self.chipKeys + ["chips", "output_enable"])) else { return ([], buses, nil) }
        let outputEnable = fields.entries["output_enable"].flatMap { gpioOutput($0, field: "servo.output_enable", activeLow: true) }
        var chips: [PCA9685Chip] = []
        if let list = fields.entries["chips"] {
            if case .sequence(let items, _) = list {
                for (index, item) in items.prefix(16).enumerated() {
                    if let chipFields = mapping(item, "servo.chips[\(index)]", allowed: Set(Self.chipKeys)), let chip = chip(chipFields, buses: buses) { chips.append(chip) }
                }
            } else {
                fail(list, "servo.chips", "must be a list of chips")
            }
        } else if let chip = chip(fields, buses: buses) {
            chips.append(chip)
        }
        return (chips, buses, outputEnable)
    }
}
