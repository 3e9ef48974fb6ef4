import Hardware
import Testing
@testable import Board

/// The crash cleanup's two sources: the daemon's record, and the board file
/// read leniently when there is none.
@Suite("What safe-outputs switches off")
struct DrivenOutputsTests {
    static let twoChips = DrivenOutputs(
        chips: [.init(bus: .device(path: "/dev/i2c-1"), address: I2CAddress(0x40)!), .init(bus: .adapter(name: "bcm2835 (i2c@7e804000)"), address: I2CAddress(0x41)!)],
        outputEnable: .gpio(chip: "gpiochip0", line: 4, lineName: nil, activeLow: true))

    @Test func aRecordReadsBackAsWritten() throws {
        #expect(try DrivenOutputs.parse(record: Self.twoChips.record) == Self.twoChips)
        let byName = DrivenOutputs(chips: [], outputEnable: .gpio(chip: "", line: nil, lineName: "GPIO22", activeLow: false))
        #expect(try DrivenOutputs.parse(record: byName.record) == byName)
    }

    @Test(arguments: [
        "",
        "pca9685\t64\tdevice\t/dev/i2c-1\n",
        "# blecontrold: the outputs this daemon drives, written at its start; `blecontrold safe-outputs` switches them off\npca9685\t64\tdevice\t/dev/i2c-1",
        "# blecontrold: the outputs this daemon drives, written at its start; `blecontrold safe-outputs` switches them off\npca9685\t200\tdevice\t/dev/i2c-1\n",
        "# blecontrold: the outputs this daemon drives, written at its start; `blecontrold safe-outputs` switches them off\npca9685\t64\tdevice\t/etc/passwd\n",
        "# blecontrold: the outputs this daemon drives, written at its start; `blecontrold safe-outputs` switches them off\nrm -rf /\n",
    ])
    func anythingElseIsNotARecord(_ text: String) {
        #expect(throws: DrivenOutputs.RecordError.self) { try DrivenOutputs.parse(record: text) }
    }

    @Test func aBoardFileBrokenByATypoStillNamesItsChipsAndLine() {
        let text = """
        name: pi
        buses:
          i2c:
            device: /dev/i2c-1
        servo:
          bus: i2c
          address: 0x41
          frequncy_hz: 50
          output_enable:
            line: 4
          channels:
            - channel: 0
              role: servo
              max_us: banana
        lcd:
          bus: i2c
          colums: 16
        """
        #expect(throws: BoardFileError.self) { try BoardFile.parse(text, path: "pi.yaml") }
        let (outputs, problems) = BoardFile.drivenOutputs(leniently: text, path: "pi.yaml")
        #expect(outputs == DrivenOutputs(chips: [.init(bus: .device(path: "/dev/i2c-1"), address: I2CAddress(0x41)!)],
                                         outputEnable: .gpio(chip: "gpiochip0", line: 4, lineName: nil, activeLow: true)))
        #expect(problems.isEmpty, "\(problems)")
    }

    @Test func severalChipsAreReadAndABrokenEntryIsLeftOutAndNamed() {
        let text = """
        name: hexapod
        buses:
          a:
            device: /dev/i2c-1
          sim:
            emulated: true
        servo:
          chips:
            - bus: a
              address: 0x40
            - bus: a
              address: 0x200
            - bus: sim
              address: 0x42
            - bus: a
              address: 0x43
        """
        let (outputs, problems) = BoardFile.drivenOutputs(leniently: text, path: "h.yaml")
        #expect(outputs.chips == [.init(bus: .device(path: "/dev/i2c-1"), address: I2CAddress(0x40)!), .init(bus: .device(path: "/dev/i2c-1"), address: I2CAddress(0x43)!)])
        #expect(problems.map(\.field) == ["servo.chips[1].address"])
    }

    @Test func theEmbeddedBoardsDriveOnlyWhatTheirFilesSay() throws {
        let simulator = try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
        #expect(DrivenOutputs(simulator) == DrivenOutputs(chips: [], outputEnable: nil))
    }
}
