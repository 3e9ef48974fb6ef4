import Hardware
@testable import LinuxHardware
import Testing

/// What the kernel's i2c-stub reports (drivers/i2c/i2c-stub.c, stub_func):
/// SMBus quick, byte, byte data, word data and I2C block, no plain I2C.
private let stubLike: I2CFunctionality = [
    .smbusQuick, .smbusReadByte, .smbusWriteByte, .smbusReadByteData, .smbusWriteByteData,
    .smbusReadWordData, .smbusWriteWordData, .smbusReadI2CBlock, .smbusWriteI2CBlock,
]
/// An older SMBus host controller: byte and word commands, no I2C block transfers.
private let noBlocks: I2CFunctionality = [
    .smbusQuick, .smbusReadByte, .smbusWriteByte, .smbusReadByteData, .smbusWriteByteData,
    .smbusReadWordData, .smbusWriteWordData,
]

private func plan(_ messages: [I2CMessage], _ style: SMBusWriteStyle = .registerBlock,
                  _ functionality: I2CFunctionality = stubLike) throws -> [SMBusOperation] {
    try SMBusTranslation.plan(for: messages, style: style, functionality: functionality)
}

@Suite("SMBus translation of I2C transactions")
struct SMBusTranslationTests {
    @Test("the block limit comes from the kernel header: 32 data bytes")
    func blockMax() {
        #expect(SMBusTranslation.blockMax == 32)
    }

    @Test("register writes: [reg, v] is write byte data, longer is one I2C block write")
    func registerWrites() throws {
        #expect(try plan([.write([0x00, 0x21])]) == [.writeByteData(command: 0x00, value: 0x21)])
        // PCA9685 LED0_ON_L…LED0_OFF_H (datasheet §7.3.3): one block of 4 bytes at 0x06.
        #expect(try plan([.write([0x06, 0x00, 0x00, 0x33, 0x01])])
                == [.writeBlock(command: 0x06, data: [0x00, 0x00, 0x33, 0x01])])
        #expect(try plan([.write([0x06])]) == [.sendByte(0x06)])
        #expect(try plan([.write([])]) == [.quickWrite])
    }

    @Test("a write longer than one block is split, the register advanced by the bytes sent")
    func chunking() throws {
        let data = (0..<64).map { UInt8($0) }
        #expect(try plan([.write([0x06] + data)]) == [
            .writeBlock(command: 0x06, data: Array(data[0..<32])),
            .writeBlock(command: 0x26, data: Array(data[32..<64])),
        ])
        let odd = (0..<33).map { UInt8($0 + 100) }
        #expect(try plan([.write([0x10] + odd)]) == [
            .writeBlock(command: 0x10, data: Array(odd[0..<32])),
            .writeBlock(command: 0x30, data: [odd[32]]),
        ])
    }

    @Test("a split that would run past register 0xff is refused")
    func pastLastRegister() {
        #expect(throws: SMBusTranslationError.self) {
            try plan([.write([0xF0] + [UInt8](repeating: 1, count: 40))])
        }
    }

    @Test("byte stream (PCF8574): every byte is its own send byte, in order")
    func byteStream() throws {
        #expect(try plan([.write([0x0C, 0x08, 0x3C])], .byteStream)
                == [.sendByte(0x0C), .sendByte(0x08), .sendByte(0x3C)])
        #expect(try plan([.read(count: 2)], .byteStream) == [.receiveByte(reply: 0), .receiveByte(reply: 0)])
        #expect(try plan([.write([0xFF]), .read(count: 1)], .byteStream) == [.sendByte(0xFF), .receiveByte(reply: 0)])
    }

    @Test("register reads: byte data for one byte, I2C block reads beyond, split at 32")
    func registerReads() throws {
        #expect(try plan([.write([0x00]), .read(count: 1)]) == [.readByteData(command: 0x00, reply: 0)])
        #expect(try plan([.write([0x06]), .read(count: 4)]) == [.readBlock(command: 0x06, count: 4, reply: 0)])
        #expect(try plan([.write([0x06]), .read(count: 40)]) == [
            .readBlock(command: 0x06, count: 32, reply: 0),
            .readBlock(command: 0x26, count: 8, reply: 0),
        ])
        #expect(try plan([.read(count: 1)]) == [.receiveByte(reply: 0)])
    }

    @Test("without I2C block support: 3-byte writes and 2-byte reads use word data, low byte first")
    func wordFallback() throws {
        #expect(try plan([.write([0x06, 0x34, 0x12])], .registerBlock, noBlocks)
                == [.writeWordData(command: 0x06, value: 0x1234)])
        #expect(try plan([.write([0x06]), .read(count: 2)], .registerBlock, noBlocks)
                == [.readWordData(command: 0x06, reply: 0)])
        #expect(throws: SMBusTranslationError.self) {
            try plan([.write([0x06, 1, 2, 3, 4])], .registerBlock, noBlocks)
        }
    }

    @Test("block-only adapters get a one-byte block write for [reg, v]")
    func blockOnly() throws {
        let blockOnly: I2CFunctionality = [.smbusWriteI2CBlock, .smbusReadI2CBlock]
        #expect(try plan([.write([0x01, 0x02])], .registerBlock, blockOnly) == [.writeBlock(command: 0x01, data: [0x02])])
        #expect(try plan([.write([0x01]), .read(count: 1)], .registerBlock, blockOnly)
                == [.readBlock(command: 0x01, count: 1, reply: 0)])
    }

    @Test("transactions with no SMBus form are refused, not split into something else", arguments: [
        [I2CMessage.write([0x00, 0x01]), .read(count: 1)],
        [.write([0x00]), .write([0x01])],
        [.read(count: 2)],
        [.write([0x00]), .read(count: 0)],
        [.write([0x00]), .read(count: 1), .read(count: 1)],
    ])
    func refused(messages: [I2CMessage]) {
        #expect(throws: SMBusTranslationError.self) { try plan(messages) }
    }

    @Test("missing adapter functions are named in the refusal")
    func missingFunction() {
        do {
            _ = try plan([.write([0x27])], .registerBlock, [.smbusQuick])
            Issue.record("expected a refusal")
        } catch let error as SMBusTranslationError {
            #expect(error.reason.contains("SMBus send byte"))
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("the operations' descriptions say what went on the wire")
    func descriptions() {
        #expect(SMBusOperation.writeBlock(command: 0x06, data: [1, 2, 3, 4]).description
                == "SMBus I2C block write of 4 bytes, command 0x06")
        #expect(SMBusOperation.sendByte(0x08).description == "SMBus send byte")
    }
}
