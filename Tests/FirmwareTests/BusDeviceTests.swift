import Board
@testable import Firmware
@testable import Runtime
import Logging
import Testing

@Suite("Buses named by device or by adapter")
struct BusDeviceTests {
    @Test("a device bus is its node; an emulated one is always there; an adapter no one has is never there")
    func presence() throws {
        #expect(BusConfiguration.Kind.emulated.isPresent)
        #expect(BusConfiguration.Kind.device(path: "/dev/null").isPresent)
        #expect(!BusConfiguration.Kind.device(path: "/dev/i2c-blc-absent").isPresent)
        #expect(!BusConfiguration.Kind.adapter(name: "BLC no such adapter").isPresent)
        #expect(try BusConfiguration.Kind.emulated.devicePath() == nil)
    }

    @Test("opening a board whose adapter is not there fails naming the bus and the adapters there are")
    func missingAdapter() throws {
        let board = try BoardFile.parse("""
        name: t
        buses:
          header: { adapter: "BLC no such adapter" }
        """, path: "t.yaml")
        do {
            _ = try BoardBuses.open(board, logger: Logger(label: "test"))
            Issue.record("opened an adapter that is not there")
        } catch {
            #expect("\(error)".hasPrefix("bus header: no I2C adapter is named \"BLC no such adapter\""), "\(error)")
        }
    }
}
