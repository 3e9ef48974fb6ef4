import Devices
import Hardware
import Testing

@Suite("Units as people read them")
struct UnitsTests {
    @Test("A prescaled frequency and a pulse print with sensible precision, not float noise")
    func descriptions() {
        // 25 MHz / (4096 × 122): what a PCA9685 at "50 Hz" really makes (§7.3.5).
        #expect("\(Hertz(25_000_000.0 / (4096 * 122)))" == "50.029 Hz")
        #expect("\(Hertz(50))" == "50 Hz")
        #expect("\(Microseconds(2000.7999999))" == "2000.8 µs")
        #expect("\(Microseconds(1500))" == "1500 µs")
        #expect("\(Microseconds(-0.04))" == "0 µs")
    }
}
