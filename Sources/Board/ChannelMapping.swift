import Devices
import Hardware

/// How protocol values become PCA9685 outputs for one configured channel.
/// One place for the arithmetic of docs/protocol.md's SERVO_VAL and PWM_VAL.
extension ChannelConfiguration {
    /// The original firmware's timers: 1 MHz tick, 20 000-tick (50 Hz) period.
    public static let originalPeriod = Microseconds(20_000)

    /// SERVO_VAL: width = 1000 µs + value µs. Servo and ESC channels clamp it to
    /// the nominal range, mirror it when inverted and apply their calibration
    /// (`safePulse`); a PWM channel gets the raw width, as the original board
    /// produced it.
    public func output(forServoValue value: UInt16) -> PCA9685.Output {
        let width = 1000 + Double(value)
        switch role {
        case .servo, .esc:
            return .pulse(safePulse(width))
        case .pwm:
            return .pulse(Microseconds(min(width, Self.originalPeriod.value)))
        }
    }

    /// PWM_VAL: duty = value / 1000, values above 1000 clamped to 100 %. On a
    /// servo or ESC channel the same duty of the original 20 ms period is
    /// turned into a pulse and clamped to the safe range: a 100 % duty would
    /// otherwise hold a servo's signal line high.
    public func output(forPWMValue value: UInt16) -> PCA9685.Output {
        let duty = Double(min(value, 1000)) / 1000
        switch role {
        case .pwm:
            return .duty(duty)
        case .servo, .esc:
            return .pulse(safePulse(duty * Self.originalPeriod.value))
        }
    }

    /// The SERVO_VAL that makes this servo or ESC channel produce `pulse`
    /// (clamped to its calibrated range): ``output(forServoValue:)``
    /// undone, calibration and inversion included, rounded to the nearest
    /// value. For Home Assistant, which speaks in µs.
    public func servoValue(forPulse pulse: Microseconds) -> UInt16 {
        let nominal = Self.nominal
        let width = min(max(pulse.value, minimum.value), maximum.value)
        var value: Double
        if width <= center.value {
            let span = center.value - minimum.value
            value = nominal.minimum + (span > 0 ? (width - minimum.value) / span : 0) * (nominal.center - nominal.minimum)
        } else {
            let span = maximum.value - center.value
            value = nominal.center + (span > 0 ? (width - center.value) / span : 0) * (nominal.maximum - nominal.center)
        }
        if invert { value = nominal.minimum + nominal.maximum - value }
        return UInt16(min(max((value - nominal.minimum).rounded(), 0), 1000))
    }

    /// The original board's nominal servo range: 1000…2000 µs, centre 1500.
    static let nominal = (minimum: 1000.0, center: 1500.0, maximum: 2000.0)

    /// Clamps a nominal width to 1000…2000 µs, mirrors it when inverted, and
    /// maps it piecewise-linearly onto this channel's calibration: 1000 →
    /// min_us, 1500 → center_us, 2000 → max_us. With the defaults
    /// (1000/1500/2000) this is the identity, exactly docs/protocol.md's
    /// `1000 + value`; a servo that needs 600–2400 µs for its full travel,
    /// or whose neutral sits at 1480 µs, gets it from the board file.
    private func safePulse(_ width: Double) -> Microseconds {
        let nominal = Self.nominal
        var value = min(max(width, nominal.minimum), nominal.maximum)
        if invert { value = nominal.minimum + nominal.maximum - value }
        if value <= nominal.center {
            let fraction = (value - nominal.minimum) / (nominal.center - nominal.minimum)
            return Microseconds(minimum.value + fraction * (center.value - minimum.value))
        }
        let fraction = (value - nominal.center) / (nominal.maximum - nominal.center)
        return Microseconds(center.value + fraction * (maximum.value - center.value))
    }
}

/// A pulse width asked of a channel in µs (MQTT's `…/pulse/N/set`,
/// `blecontrol pulse`): the SERVO_VAL that gives it, or why none does.
/// One place for both, so a channel's calibration is read the same way.
public enum PulseRequest {
    /// Why a pulse cannot be asked of a channel.
    public enum Refusal: Error, Equatable, CustomStringConvertible {
        case noChannel(Int)
        /// A PWM channel takes a duty, not a pulse.
        case pwmChannel(Int)
        /// Beyond the channel's calibrated range (min_us…max_us).
        case outsideCalibration(channel: Int, microseconds: Double, minimum: Double, maximum: Double)

        public var description: String {
            switch self {
            case .noChannel(let channel): return "there is no channel \(channel)"
            case .pwmChannel(let channel): return "channel \(channel) is a PWM channel: it takes a duty, not a pulse"
            case .outsideCalibration(let channel, let microseconds, let minimum, let maximum):
                return "\(Self.figure(microseconds)) µs is outside channel \(channel)'s calibration (\(Self.figure(minimum))…\(Self.figure(maximum)) µs);"
                    + " to go further, widen its min_us/max_us in the board file and reload (docs/calibration.md)"
            }
        }

        private static func figure(_ value: Double) -> String {
            value == value.rounded() ? "\(Int(value))" : "\((value * 10).rounded() / 10)"
        }
    }

    /// The SERVO_VAL that makes `channel` produce `microseconds`.
    /// `clamp`: a pulse beyond the calibration goes to its nearest end (Home
    /// Assistant's number is bounded by it anyway); otherwise it is refused,
    /// so an operator never believes a servo reached a pulse it did not.
    public static func servoValue(_ microseconds: Double, channel: Int, of channels: [ChannelConfiguration], clamp: Bool) -> Result<UInt16, Refusal> {
        guard let configuration = channels.first(where: { $0.channel == channel }) else { return .failure(.noChannel(channel)) }
        guard configuration.role != .pwm else { return .failure(.pwmChannel(channel)) }
        let (minimum, maximum) = (configuration.minimum.value, configuration.maximum.value)
        if !clamp, !(minimum...maximum).contains(microseconds) {
            return .failure(.outsideCalibration(channel: channel, microseconds: microseconds, minimum: minimum, maximum: maximum))
        }
        return .success(configuration.servoValue(forPulse: Microseconds(microseconds)))
    }
}
