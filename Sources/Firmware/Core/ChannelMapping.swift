import Devices
import Hardware

/// How protocol values become PCA9685 outputs for one configured channel.
/// One place for the arithmetic of PROTOCOL.md's SERVO_VAL and PWM_VAL.
extension ChannelConfiguration {
    /// The original firmware's timers: 1 MHz tick, 20 000-tick (50 Hz) period.
    static let originalPeriod = Microseconds(20_000)

    /// SERVO_VAL: width = 1000 µs + value µs. Servo and ESC channels clamp it to
    /// their safe range (and mirror it when inverted); a PWM channel gets the
    /// raw width, as the original board produced it.
    func output(forServoValue value: UInt16) -> PCA9685.Output {
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
    func output(forPWMValue value: UInt16) -> PCA9685.Output {
        let duty = Double(min(value, 1000)) / 1000
        switch role {
        case .pwm:
            return .duty(duty)
        case .servo, .esc:
            return .pulse(safePulse(duty * Self.originalPeriod.value))
        }
    }

    private func safePulse(_ width: Double) -> Microseconds {
        let clamped = min(max(width, minimum.value), maximum.value)
        return Microseconds(invert ? minimum.value + maximum.value - clamped : clamped)
    }
}
