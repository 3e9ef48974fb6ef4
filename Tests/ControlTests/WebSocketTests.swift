import Control
import Testing

/// The bridge's WebSocket framing (RFC 6455), byte for byte.
@Suite("WebSocket: the handshake key and the framing")
struct WebSocketTests {
    /// A client frame as a browser sends it: masked.
    private func masked(_ opcode: UInt8, _ payload: [UInt8], final: Bool = true, mask: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]) -> [UInt8] {
        var bytes: [UInt8] = [(final ? 0x80 : 0) | opcode]
        if payload.count < 126 {
            bytes.append(0x80 | UInt8(payload.count))
        } else {
            bytes += [UInt8(0x80 | 126), UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        }
        bytes += mask
        bytes += payload.enumerated().map { $0.element ^ mask[$0.offset & 3] }
        return bytes
    }

    @Test("The accept key of RFC 6455 §1.3's example")
    func acceptKey() {
        #expect(WebSocket.accept(key: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        #expect(WebSocket.isValid(key: "dGhlIHNhbXBsZSBub25jZQ=="))
        #expect(!WebSocket.isValid(key: "short=="))
        #expect(!WebSocket.isValid(key: "dGhlIHNhbXBsZSBub25j!Q=="))
    }

    @Test("RFC 6455 §5.7's masked \"Hello\", split anywhere, is one text message")
    func maskedHello() throws {
        let frame: [UInt8] = [0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58]
        for split in 0...frame.count {
            var decoder = WebSocket.Decoder()
            let first = try decoder.push(frame[..<split])
            let events = try first + decoder.push(frame[split...])
            #expect(events == [.text(Array("Hello".utf8))], "split at \(split)")
        }
    }

    @Test("Fragments are reassembled; a ping between them is answered on its own")
    func fragments() throws {
        var decoder = WebSocket.Decoder()
        let bytes = masked(0x2, [1, 2], final: false) + masked(0x9, [7]) + masked(0x0, [3], final: false) + masked(0x0, [4])
        let events = try decoder.push(bytes)
        #expect(events == [.ping([7]), .binary([1, 2, 3, 4])])
        let closing = try decoder.push(masked(0x8, [0x03, 0xE8]))
        #expect(closing == [.close(1000)])
    }

    @Test("Broken frames close with the right code, and the decoder takes nothing more")
    func violations() throws {
        func code(_ bytes: [UInt8]) -> UInt16? {
            var decoder = WebSocket.Decoder()
            guard case .failure(let violation) = decoder.feed(bytes) else { return nil }
            let after = try? decoder.push(masked(0x2, [1]))
            #expect(after == [], "nothing after a violation")
            return violation.code
        }
        #expect(code([0x82, 0x01, 0x00]) == 1002, "unmasked")
        #expect(code([0xC2] + masked(0x2, [1]).dropFirst()) == 1002, "a reserved bit")
        #expect(code([0x83] + masked(0x2, [1]).dropFirst()) == 1002, "an unknown opcode")
        #expect(code(masked(0x0, [1])) == 1002, "a continuation of nothing")
        #expect(code(masked(0x2, [1], final: false) + masked(0x2, [2])) == 1002, "a new message inside a fragmented one")
        #expect(code(masked(0x9, [1], final: false)) == 1002, "a fragmented ping")
        #expect(code(masked(0x8, [3])) == 1002, "a close with a one-byte body")
        // 64-bit length of 1 GiB: refused from the header, before any payload.
        #expect(code([0x82, 0xFF, 0, 0, 0, 0, 0x40, 0, 0, 0, 1, 2, 3, 4]) == 1009, "a huge announced length")
        let half = WebSocket.maximumMessage / 2 + 1
        #expect(code(masked(0x2, [UInt8](repeating: 0, count: half), final: false) + masked(0x0, [UInt8](repeating: 0, count: half))) == 1009,
                "fragments that add up to more than the limit")
    }

    @Test("Server frames: unmasked, with the 7-, 16- and 64-bit lengths")
    func serverFrames() {
        #expect(WebSocket.frame(.text, Array("Hi".utf8)) == [0x81, 0x02, 0x48, 0x69])
        let medium = WebSocket.frame(.binary, [UInt8](repeating: 9, count: 300))
        #expect(Array(medium.prefix(4)) == [0x82, 126, 0x01, 0x2C] && medium.count == 304)
        let large = WebSocket.frame(.binary, [UInt8](repeating: 9, count: 70000))
        #expect(Array(large.prefix(10)) == [0x82, 127, 0, 0, 0, 0, 0, 0x01, 0x11, 0x70] && large.count == 70010)
        #expect(WebSocket.closeFrame(1008) == [0x88, 0x02, 0x03, 0xF0])
    }
}
