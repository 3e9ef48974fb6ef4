import Reactor

/// Text ↔ character codes of the HD44780U character generator ROM, code
/// A00 (the "Japanese standard font" fitted to nearly every module sold):
/// Hitachi HD44780U datasheet, Table 4, "Correspondence between Character
/// Codes and Character Patterns (ROM Code: A00)".
///
/// What A00 holds, and how text maps onto it:
/// - 0x20…0x7D are ASCII, except 0x5C, which is the yen sign ¥. 0x7E is →,
///   0x7F is ←. So `\` and `~` have no glyph.
/// - 0xA1…0xDF are the JIS X 0201 half-width katakana and punctuation
///   (U+FF61…U+FF9F); 0xDF, the handakuten, is the customary degree sign.
/// - 0xE0…0xFF hold α ä β ε μ σ ρ √ ¢ £ ñ ö θ ∞ Ω ü Σ π x̄ 千 万 円 ÷ █ and
///   descender forms of g j p q y. β (0xE2) doubles as ß.
/// - 0x00…0x0F are the user-defined CGRAM characters; 0x10…0x1F and
///   0x80…0xA0 are blank.
///
/// Encoding works per `Character` (grapheme cluster), so one user-perceived
/// character takes one cell:
/// 1. Printable ASCII 0x20…0x7E maps to itself, `\` and `~` included: A00
///    shows them as ¥ and →, exactly as the original board did when it copied
///    the bytes to the display. Control characters become a space (they have
///    no glyph and must never select a CGRAM pattern).
/// 2. Characters A00 has, including canonically equivalent spellings
///    (`"a\u{308}"` is `ä`), map to their code. A00 has no capital umlauts:
///    Ä Ö Ü and Ñ use the lowercase glyphs, which keep the word readable.
/// 3. Other Latin letters with diacritics fold to their base letter
///    (é → e, Å → A), via canonical decomposition.
/// 4. Anything else (€, emoji) becomes ``fallback``, the full block 0xFF:
///    visibly "a character this display cannot show", one cell wide, never
///    mistaken for text the sender wrote (as `?` would be).
///
/// Bytes that are not valid UTF-8 are not text at all: they are the ROM's
/// own codes, shown as the original board showed them (``encode(utf8:)``:
/// `DF` is the degree sign, `A5` the katakana middle dot).
public enum CharacterROM {
    /// The code shown for characters A00 cannot display: 0xFF, the full block.
    public static let fallback: UInt8 = 0xFF

    /// The code of a space, which also fills unused cells.
    public static let space: UInt8 = 0x20

    /// The A00 codes for `text`, one per character (see the type's notes).
    public static func encode(_ text: String) -> [UInt8] {
        var codes: [UInt8] = []
        codes.reserveCapacity(text.utf8.count)
        for character in text {
            append(character, to: &codes)
        }
        return codes
    }

    /// The A00 codes for `bytes` as they arrived in a frame: every valid
    /// UTF-8 sequence as text (one cell per character), and every byte that
    /// is not part of one as the ROM code it is, one cell per byte. So a
    /// phone's UTF-8 "°C" and a hand-typed raw `DF 43` both show °C, and
    /// arbitrary bytes never trap and never vanish.
    public static func encode(utf8 bytes: [UInt8]) -> [UInt8] {
        var codes: [UInt8] = []
        codes.reserveCapacity(bytes.count)
        var runStart = 0
        var index = 0
        while index < bytes.count {
            let length = validSequenceLength(bytes, at: index)
            if length > 0 {
                index += length
                continue
            }
            if runStart < index { codes += encode(String(decoding: bytes[runStart..<index], as: UTF8.self)) }
            codes.append(bytes[index])
            index += 1
            runStart = index
        }
        if runStart < bytes.count { codes += encode(String(decoding: bytes[runStart...], as: UTF8.self)) }
        return codes
    }

    /// The length of the well-formed UTF-8 sequence at `index` (Unicode
    /// Table 3-7: no overlong forms, no surrogates, nothing past U+10FFFF),
    /// or 0 when the byte there does not start one.
    static func validSequenceLength(_ bytes: [UInt8], at index: Int) -> Int {
        let first = bytes[index]
        func continuation(_ offset: Int, _ range: ClosedRange<UInt8> = 0x80...0xBF) -> Bool {
            index + offset < bytes.count && range.contains(bytes[index + offset])
        }
        switch first {
        case 0x00...0x7F: return 1
        case 0xC2...0xDF: return continuation(1) ? 2 : 0
        case 0xE0: return continuation(1, 0xA0...0xBF) && continuation(2) ? 3 : 0
        case 0xE1...0xEC, 0xEE...0xEF: return continuation(1) && continuation(2) ? 3 : 0
        case 0xED: return continuation(1, 0x80...0x9F) && continuation(2) ? 3 : 0
        case 0xF0: return continuation(1, 0x90...0xBF) && continuation(2) && continuation(3) ? 4 : 0
        case 0xF1...0xF3: return continuation(1) && continuation(2) && continuation(3) ? 4 : 0
        case 0xF4: return continuation(1, 0x80...0x8F) && continuation(2) && continuation(3) ? 4 : 0
        default: return 0
        }
    }

    /// The text an A00 display shows for `codes`: exactly one `Character`
    /// per code, so a row of n cells decodes to n characters. Blank codes
    /// decode to spaces, CGRAM codes (user-defined patterns) to U+FFFD.
    public static func decode(_ codes: [UInt8]) -> String {
        var text = ""
        text.unicodeScalars.reserveCapacity(codes.count)
        for code in codes {
            text.unicodeScalars.append(contentsOf: decodeTable[Int(code)].unicodeScalars)
        }
        return text
    }

    /// The glyph of one code, as text.
    public static func character(for code: UInt8) -> Character {
        decodeTable[Int(code)]
    }

    // MARK: Encoding

    private static func append(_ character: Character, to codes: inout [UInt8]) {
        let scalars = character.unicodeScalars
        if scalars.count == 1, let scalar = scalars.first {
            let value = scalar.value
            if value >= 0x20, value <= 0x7E {
                codes.append(UInt8(value))
                return
            }
        }
        if scalars.allSatisfy({ $0.properties.generalCategory == .control }) {
            codes.append(space)
            return
        }
        // Half-width katakana: a voiced kana is one grapheme cluster
        // (U+FF9E/U+FF9F extend it) but two cells, as it is on paper.
        if scalars.allSatisfy({ (0xFF61...0xFF9F).contains($0.value) }) {
            for scalar in scalars {
                codes.append(UInt8(scalar.value - 0xFF61 + 0xA1))
            }
            return
        }
        if let code = table[character] {
            codes.append(code)
            return
        }
        codes.append(folded(character) ?? fallback)
    }

    /// The ASCII base letter of a Latin letter with diacritics, if that is
    /// all it is.
    private static func folded(_ character: Character) -> UInt8? {
        let scalars = Array(character.unicodeScalars)
        let base: Unicode.Scalar
        if scalars.count > 1 {
            // Already decomposed: a base letter and combining marks.
            guard scalars.dropFirst().allSatisfy({ $0.properties.generalCategory == .nonspacingMark }) else { return nil }
            base = scalars[0]
        } else if let name = scalars.first?.properties.name {
            // Precomposed: the Unicode name says "LATIN SMALL LETTER E WITH
            // ACUTE"; the letter before WITH is the base (no normalisation
            // tables needed, and the stdlib has every name).
            let words = name.split(separator: " ")
            guard words.count > 5, words[0] == "LATIN", words[2] == "LETTER", words[4] == "WITH", words[3].count == 1,
                  let letter = words[3].unicodeScalars.first, letter.isASCII else { return nil }
            base = words[1] == "SMALL" ? Unicode.Scalar(letter.value | 0x20)! : letter
        } else {
            return nil
        }
        guard base.value >= 0x21, base.value <= 0x7D, base.value != 0x5C else { return nil }
        return UInt8(base.value)
    }

    /// Non-ASCII characters with an A00 glyph. Keys are compared with
    /// `Character` equality, i.e. canonical equivalence; the table must not
    /// hold two equivalent keys (U+2126 OHM SIGN is U+03A9, for one).
    private static let table: [Character: UInt8] = {
        let pairs: [(Character, UInt8)] = [
            ("¥", 0x5C), ("→", 0x7E), ("←", 0x7F),
            ("\u{00A0}", 0x20),
            // Japanese punctuation in its full-width spellings.
            ("。", 0xA1), ("「", 0xA2), ("」", 0xA3), ("、", 0xA4), ("・", 0xA5), ("ー", 0xB0),
            ("゛", 0xDE), ("゜", 0xDF),
            ("·", 0xA5), ("°", 0xDF),
            ("α", 0xE0), ("ä", 0xE1), ("Ä", 0xE1), ("β", 0xE2), ("ß", 0xE2), ("ε", 0xE3),
            ("μ", 0xE4), ("µ", 0xE4), ("σ", 0xE5), ("ρ", 0xE6), ("√", 0xE8),
            ("¢", 0xEC), ("£", 0xED), ("ñ", 0xEE), ("Ñ", 0xEE), ("ö", 0xEF), ("Ö", 0xEF),
            ("θ", 0xF2), ("∞", 0xF3), ("Ω", 0xF4), ("ü", 0xF5), ("Ü", 0xF5),
            ("Σ", 0xF6), ("∑", 0xF6), ("π", 0xF7), ("x\u{0304}", 0xF8),
            ("千", 0xFA), ("万", 0xFB), ("円", 0xFC), ("÷", 0xFD), ("█", 0xFF),
        ]
        var table: [Character: UInt8] = [:]
        for (character, code) in pairs {
            table[character] = code
        }
        return table
    }()

    // MARK: Decoding

    private static let decodeTable: [Character] = {
        var table = [Character](repeating: " ", count: 256)
        for code in 0x00...0x0F {
            table[code] = "\u{FFFD}"
        }
        for code in 0x20...0x7D {
            table[code] = Character(Unicode.Scalar(UInt8(code)))
        }
        table[0x5C] = "¥"
        table[0x7E] = "→"
        table[0x7F] = "←"
        for code in 0xA1...0xDD {
            table[code] = Character(Unicode.Scalar(UInt32(0xFF61 + code - 0xA1))!)
        }
        // U+FF9E/U+FF9F would merge with the previous cell's character (they
        // are grapheme extenders); the spacing forms keep one per cell.
        table[0xDE] = "゛"
        table[0xDF] = "°"
        let high: [Character] = [
            "α", "ä", "β", "ε", "μ", "σ", "ρ", "g", "√", "⁻", "j", "ˣ", "¢", "£", "ñ", "ö",
            "p", "q", "θ", "∞", "Ω", "ü", "Σ", "π", "x\u{0304}", "y", "千", "万", "円", "÷", " ", "█",
        ]
        for (offset, character) in high.enumerated() {
            table[0xE0 + offset] = character
        }
        return table
    }()
}
