import CLinuxI2C

/// What an i2c-dev adapter can do: the `I2C_FUNC_*` bits of the `I2C_FUNCS`
/// ioctl (kernel `Documentation/i2c/functionality.rst`), constants taken from
/// `linux/i2c.h`.
public struct I2CFunctionality: OptionSet, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }

    /// Plain I2C transfers (`I2C_RDWR`, combined messages).
    public static let i2c = I2CFunctionality(rawValue: UInt(I2C_FUNC_I2C))
    public static let tenBitAddressing = I2CFunctionality(rawValue: UInt(I2C_FUNC_10BIT_ADDR))
    public static let smbusQuick = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_QUICK))
    public static let smbusReadByte = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_READ_BYTE))
    public static let smbusWriteByte = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_WRITE_BYTE))
    public static let smbusReadByteData = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_READ_BYTE_DATA))
    public static let smbusWriteByteData = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_WRITE_BYTE_DATA))
    public static let smbusReadWordData = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_READ_WORD_DATA))
    public static let smbusWriteWordData = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_WRITE_WORD_DATA))
    public static let smbusReadI2CBlock = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_READ_I2C_BLOCK))
    public static let smbusWriteI2CBlock = I2CFunctionality(rawValue: UInt(I2C_FUNC_SMBUS_WRITE_I2C_BLOCK))

    private static let names: [(I2CFunctionality, String)] = [
        (.i2c, "I2C"),
        (.tenBitAddressing, "10-bit addresses"),
        (.smbusQuick, "SMBus quick"),
        (.smbusReadByte, "SMBus receive byte"),
        (.smbusWriteByte, "SMBus send byte"),
        (.smbusReadByteData, "SMBus read byte data"),
        (.smbusWriteByteData, "SMBus write byte data"),
        (.smbusReadWordData, "SMBus read word data"),
        (.smbusWriteWordData, "SMBus write word data"),
        (.smbusReadI2CBlock, "SMBus I2C block read"),
        (.smbusWriteI2CBlock, "SMBus I2C block write"),
    ]

    /// The capabilities this program uses, by name, e.g. "I2C, SMBus quick".
    public var description: String {
        let present = Self.names.filter { contains($0.0) }.map { $0.1 }
        return present.isEmpty ? "none" : present.joined(separator: ", ")
    }
}
