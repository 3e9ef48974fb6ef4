import Devices
import Testing

@Suite("CharacterROM")
struct CharacterROMTests {
    @Test("printable ASCII maps to itself; \\ and ~ show as A00's ¥ and →, as on the original board")
    func ascii() {
        let printable = (0x20...0x7E).map { UInt8($0) }
        let text = String(decoding: printable, as: UTF8.self)
        #expect(CharacterROM.encode(text) == printable)
        #expect(CharacterROM.encode("a\\b~c") == [0x61, 0x5C, 0x62, 0x7E, 0x63])
    }

    @Test("characters A00 has map to their codes (datasheet Table 4)", arguments: [
        ("¥", 0x5C), ("→", 0x7E), ("←", 0x7F), ("°", 0xDF), ("α", 0xE0), ("ä", 0xE1), ("β", 0xE2),
        ("ß", 0xE2), ("ε", 0xE3), ("µ", 0xE4), ("μ", 0xE4), ("σ", 0xE5), ("ρ", 0xE6), ("√", 0xE8),
        ("¢", 0xEC), ("£", 0xED), ("ñ", 0xEE), ("ö", 0xEF), ("θ", 0xF2), ("∞", 0xF3), ("Ω", 0xF4),
        ("\u{2126}", 0xF4), ("ü", 0xF5), ("Σ", 0xF6), ("π", 0xF7), ("÷", 0xFD), ("█", 0xFF),
        ("ｱ", 0xB1), ("｡", 0xA1), ("ﾟ", 0xDF),
    ] as [(String, Int)])
    func romCharacters(text: String, code: Int) {
        #expect(CharacterROM.encode(text) == [UInt8(code)])
    }

    @Test("decomposed spellings match too; capital umlauts use the lowercase glyphs")
    func equivalence() {
        #expect(CharacterROM.encode("a\u{0308}o\u{0308}u\u{0308}") == [0xE1, 0xEF, 0xF5])
        #expect(CharacterROM.encode("ÄÖÜ") == [0xE1, 0xEF, 0xF5])
    }

    @Test("other accented Latin letters fold to their base letter")
    func folding() {
        #expect(CharacterROM.encode("Café") == Array("Cafe".utf8))
        #expect(CharacterROM.encode("e\u{0301}Å") == Array("eA".utf8))
    }

    @Test("anything else is one visible fallback cell per character")
    func fallback() {
        #expect(CharacterROM.fallback == 0xFF)
        #expect(CharacterROM.encode("5€") == [0x35, 0xFF])
        // One grapheme cluster (thumbs up + skin tone) is one cell.
        #expect(CharacterROM.encode("👍🏽!") == [0xFF, 0x21])
        #expect(CharacterROM.encode("中") == [0xFF])
    }

    @Test("control characters become spaces, never CGRAM codes")
    func controls() {
        #expect(CharacterROM.encode("a\tb\r\nc\u{0}\u{7F}") == [0x61, 0x20, 0x62, 0x20, 0x63, 0x20, 0x20])
    }

    @Test("a voiced half-width kana is two cells, as on paper")
    func halfWidthKana() {
        #expect(CharacterROM.encode("ｶﾞ") == [0xB6, 0xDE])
    }

    @Test("bytes that are not UTF-8 are the ROM's own codes: DF is °, A5 is ･; nothing traps")
    func invalidUTF8() {
        #expect(CharacterROM.encode(utf8: [0x32, 0x30, 0xDF, 0x43]) == [0x32, 0x30, 0xDF, 0x43])
        #expect(CharacterROM.decode(CharacterROM.encode(utf8: [0x32, 0x30, 0xDF, 0x43])) == "20°C")
        #expect(CharacterROM.encode(utf8: [0xA5]) == [0xA5])
        #expect(CharacterROM.encode(utf8: [0x48, 0xFF, 0xC3, 0x69]) == [0x48, 0xFF, 0xC3, 0x69])
        #expect(CharacterROM.encode(utf8: [0xC3, 0xA4]) == [0xE1], "valid UTF-8 stays text")
        #expect(CharacterROM.encode(utf8: [0xC2, 0xB0, 0x43]) == [0xDF, 0x43], "UTF-8 ° and the raw code agree")
        #expect(CharacterROM.encode(utf8: []) == [])
        #expect(CharacterROM.encode(utf8: [0xED, 0xA0, 0x80]) == [0xED, 0xA0, 0x80], "a surrogate is not UTF-8")
        // Every possible byte, alone and in pairs.
        for first in 0...255 {
            #expect(CharacterROM.encode(utf8: [UInt8(first)]).count == 1)
            for second in stride(from: 0, through: 255, by: 17) {
                #expect(!CharacterROM.encode(utf8: [UInt8(first), UInt8(second)]).isEmpty)
            }
        }
    }

    @Test("decode gives exactly one character per code, for all 256 codes")
    func decodeOnePerCode() {
        let all = (0...255).map { UInt8($0) }
        #expect(CharacterROM.decode(all).count == 256)
        for code in all {
            #expect(CharacterROM.decode([0x41, code, 0x42]).count == 3)
        }
    }

    @Test("decode undoes encode for text the ROM can show")
    func roundTrip() {
        for text in ["Hello, world!", "¥100 → 20°C", "μs π Ω ä ö ü", "ｱｲｳ"] {
            #expect(CharacterROM.decode(CharacterROM.encode(text)) == text)
        }
    }
}
