import CLinuxI2C
import Hardware

/// How ``LinuxI2CBus`` sends writes to one address when the adapter has no
/// plain I2C (`I2C_FUNC_I2C`) and every transfer must be an SMBus command.
///
/// SMBus has no "write N raw bytes" transaction, so the bus has to know what
/// the bytes mean. With plain I2C the choice does not matter: writes go out
/// unchanged as one `I2C_RDWR` message.
public enum SMBusWriteStyle: Sendable, Hashable, CustomStringConvertible {
    /// The first byte is a register (the SMBus command), the rest its data:
    /// `[reg, v]` is a Write Byte Data, longer writes are I2C Block Writes
    /// (SMBus 3.0 §6.5.4, §6.5.7). Suits register chips such as the PCA9685.
    case registerBlock
    /// The device has no registers and every byte is a value of its own
    /// (the PCF8574 latches each received byte onto its port, TI PCF8574
    /// datasheet §8.3.2): each byte goes out as a separate Send Byte
    /// (SMBus 3.0 §6.5.2). Use it for LCD backpacks.
    case byteStream

    public var description: String {
        switch self {
        case .registerBlock: return "register block"
        case .byteStream: return "byte stream"
        }
    }
}

/// One SMBus transaction, as libi2c's `i2c_smbus_*` functions perform them.
/// Reads name the index of the `.read` message whose reply they fill.
enum SMBusOperation: Sendable, Hashable, CustomStringConvertible {
    case quickWrite
    case sendByte(UInt8)
    case writeByteData(command: UInt8, value: UInt8)
    /// SMBus words go low byte first on the wire (SMBus 3.0 §6.5.4).
    case writeWordData(command: UInt8, value: UInt16)
    case writeBlock(command: UInt8, data: [UInt8])
    case receiveByte(reply: Int)
    case readByteData(command: UInt8, reply: Int)
    case readWordData(command: UInt8, reply: Int)
    case readBlock(command: UInt8, count: Int, reply: Int)

    var isWrite: Bool {
        switch self {
        case .quickWrite, .sendByte, .writeByteData, .writeWordData, .writeBlock: return true
        case .receiveByte, .readByteData, .readWordData, .readBlock: return false
        }
    }

    /// The `.read` message this operation answers, if it reads.
    var reply: Int? {
        switch self {
        case .quickWrite, .sendByte, .writeByteData, .writeWordData, .writeBlock: return nil
        case .receiveByte(let reply), .readByteData(_, let reply), .readWordData(_, let reply),
             .readBlock(_, _, let reply):
            return reply
        }
    }

    var description: String {
        switch self {
        case .quickWrite: return "SMBus quick write"
        case .sendByte: return "SMBus send byte"
        case .writeByteData(let command, _): return "SMBus write byte data, command \(hex(command))"
        case .writeWordData(let command, _): return "SMBus write word data, command \(hex(command))"
        case .writeBlock(let command, let data):
            return "SMBus I2C block write of \(data.count) bytes, command \(hex(command))"
        case .receiveByte: return "SMBus receive byte"
        case .readByteData(let command, _): return "SMBus read byte data, command \(hex(command))"
        case .readWordData(let command, _): return "SMBus read word data, command \(hex(command))"
        case .readBlock(let command, let count, _):
            return "SMBus I2C block read of \(count) bytes, command \(hex(command))"
        }
    }
}

/// Why a transaction cannot be expressed in SMBus commands this adapter has.
struct SMBusTranslationError: Error, Sendable, Hashable, CustomStringConvertible {
    var reason: String
    var description: String { reason }
}

/// Turns `I2C_RDWR`-shaped transactions into SMBus commands, for adapters
/// without `I2C_FUNC_I2C` (the kernel's i2c-stub, some SMBus host
/// controllers). Pure, so that the rules are tested without an adapter.
///
/// Rules, for ``SMBusWriteStyle/registerBlock`` (the default):
/// - write of 0 bytes → Quick Write (a presence probe);
/// - write of 1 byte → Send Byte;
/// - write of 2 bytes `[reg, v]` → Write Byte Data (I2C Block Write of one
///   byte if the adapter lacks it);
/// - write of 3 bytes on an adapter without I2C block writes → Write Word Data;
/// - longer writes → I2C Block Writes of at most `I2C_SMBUS_BLOCK_MAX` (32)
///   data bytes, the command advanced by the bytes already sent. That is
///   what one long I2C write does to a chip that auto-increments its register
///   pointer (PCA9685 with MODE1.AI, datasheet §7.3.1); drivers that honour
///   ``I2CBus/maxWriteLength`` never need more than one block;
/// - write `[reg]` then read N → Read Byte Data (N = 1), Read Word Data
///   (N = 2 without I2C block reads), else I2C Block Reads of at most 32
///   bytes with the command advanced the same way;
/// - read of 1 byte alone → Receive Byte.
///
/// For ``SMBusWriteStyle/byteStream`` every written byte is a Send Byte and
/// every read byte a Receive Byte, for any sequence of messages: a PCF8574
/// cannot tell a STOP from a repeated START.
///
/// Anything else (two-byte register pointers before a read, several writes in
/// one transaction) has no SMBus equivalent and is refused as not supported
/// instead of being split into transactions that would mean something else.
enum SMBusTranslation {
    /// Data bytes per SMBus block transfer (SMBus 3.0 §6.5.7), from the kernel header.
    static let blockMax = Int(I2C_SMBUS_BLOCK_MAX)

    static func plan(
        for messages: [I2CMessage],
        style: SMBusWriteStyle,
        functionality: I2CFunctionality
    ) throws -> [SMBusOperation] {
        switch style {
        case .byteStream:
            return try byteStreamPlan(messages, functionality)
        case .registerBlock:
            return try registerPlan(messages, functionality)
        }
    }

    private static func byteStreamPlan(_ messages: [I2CMessage], _ functionality: I2CFunctionality) throws -> [SMBusOperation] {
        var plan: [SMBusOperation] = []
        var replyIndex = 0
        for message in messages {
            switch message {
            case .write(let bytes):
                if bytes.isEmpty {
                    try require(.smbusQuick, in: functionality, for: "a zero-length write (SMBus quick)")
                    plan.append(.quickWrite)
                } else {
                    try require(.smbusWriteByte, in: functionality, for: "byte-stream writes (SMBus send byte)")
                    plan.append(contentsOf: bytes.map { SMBusOperation.sendByte($0) })
                }
            case .read(let count):
                guard count > 0 else { throw SMBusTranslationError(reason: "a zero-length read has no SMBus form") }
                try require(.smbusReadByte, in: functionality, for: "byte-stream reads (SMBus receive byte)")
                plan.append(contentsOf: repeatElement(SMBusOperation.receiveByte(reply: replyIndex), count: count))
                replyIndex += 1
            }
        }
        return plan
    }

    private static func registerPlan(_ messages: [I2CMessage], _ functionality: I2CFunctionality) throws -> [SMBusOperation] {
        switch messages.count {
        case 0:
            return []
        case 1:
            switch messages[0] {
            case .write(let bytes):
                return try registerWrite(bytes, functionality)
            case .read(let count):
                guard count == 1 else {
                    throw SMBusTranslationError(
                        reason: "a read of \(count) bytes without a register has no SMBus form (only 1 byte, receive byte; use the byte-stream style for port expanders)")
                }
                try require(.smbusReadByte, in: functionality, for: "a 1-byte read (SMBus receive byte)")
                return [.receiveByte(reply: 0)]
            }
        case 2:
            guard case .write(let pointer) = messages[0], case .read(let count) = messages[1] else { break }
            guard pointer.count == 1 else {
                throw SMBusTranslationError(
                    reason: "a register read needs a 1-byte register over SMBus, not \(pointer.count) bytes")
            }
            return try registerRead(command: pointer[0], count: count, functionality)
        default:
            break
        }
        let shape = messages.map { message -> String in
            switch message {
            case .write(let bytes): return "write \(bytes.count)"
            case .read(let count): return "read \(count)"
            }
        }.joined(separator: ", ")
        throw SMBusTranslationError(reason: "the transaction [\(shape)] has no SMBus form")
    }

    private static func registerWrite(_ bytes: [UInt8], _ functionality: I2CFunctionality) throws -> [SMBusOperation] {
        switch bytes.count {
        case 0:
            try require(.smbusQuick, in: functionality, for: "a zero-length write (SMBus quick)")
            return [.quickWrite]
        case 1:
            try require(.smbusWriteByte, in: functionality, for: "a 1-byte write (SMBus send byte)")
            return [.sendByte(bytes[0])]
        case 2 where functionality.contains(.smbusWriteByteData) || !functionality.contains(.smbusWriteI2CBlock):
            try require(.smbusWriteByteData, in: functionality, for: "a register write (SMBus write byte data)")
            return [.writeByteData(command: bytes[0], value: bytes[1])]
        case 3 where !functionality.contains(.smbusWriteI2CBlock) && functionality.contains(.smbusWriteWordData):
            return [.writeWordData(command: bytes[0], value: UInt16(bytes[1]) | UInt16(bytes[2]) << 8)]
        default:
            try require(.smbusWriteI2CBlock, in: functionality, for: "a write of \(bytes.count) bytes (SMBus I2C block write)")
            let data = bytes.dropFirst()
            return try blocks(from: bytes[0], total: data.count) { command, range in
                .writeBlock(command: command, data: Array(data[data.startIndex + range.lowerBound ..< data.startIndex + range.upperBound]))
            }
        }
    }

    private static func registerRead(command: UInt8, count: Int, _ functionality: I2CFunctionality) throws -> [SMBusOperation] {
        guard count > 0 else { throw SMBusTranslationError(reason: "a zero-length register read has no SMBus form") }
        let blockRead = functionality.contains(.smbusReadI2CBlock)
        if count == 1 && (functionality.contains(.smbusReadByteData) || !blockRead) {
            try require(.smbusReadByteData, in: functionality, for: "a register read (SMBus read byte data)")
            return [.readByteData(command: command, reply: 0)]
        }
        if count == 2 && !blockRead && functionality.contains(.smbusReadWordData) {
            return [.readWordData(command: command, reply: 0)]
        }
        try require(.smbusReadI2CBlock, in: functionality, for: "a register read of \(count) bytes (SMBus I2C block read)")
        return try blocks(from: command, total: count) { command, range in
            .readBlock(command: command, count: range.count, reply: 0)
        }
    }

    /// Splits `total` bytes into blocks of at most ``blockMax``, each starting
    /// at the register `first` + its offset.
    private static func blocks(
        from first: UInt8,
        total: Int,
        _ make: (UInt8, Range<Int>) -> SMBusOperation
    ) throws -> [SMBusOperation] {
        var operations: [SMBusOperation] = []
        var offset = 0
        while offset < total {
            let command = Int(first) + offset
            guard command <= Int(UInt8.max) else {
                throw SMBusTranslationError(
                    reason: "\(total) bytes from register \(hex(first)) run past register 0xff")
            }
            let end = min(offset + blockMax, total)
            operations.append(make(UInt8(command), offset..<end))
            offset = end
        }
        return operations
    }

    private static func require(_ needed: I2CFunctionality, in functionality: I2CFunctionality, for what: String) throws {
        guard functionality.isSuperset(of: needed) else {
            throw SMBusTranslationError(reason: "the adapter cannot do \(what): it lacks \(needed)")
        }
    }
}

func hex(_ byte: UInt8) -> String {
    let digits = String(byte, radix: 16)
    return "0x" + (digits.count < 2 ? "0" + digits : digits)
}
