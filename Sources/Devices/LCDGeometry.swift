/// The visible size of an HD44780 character display and where its rows live
/// in display data RAM (DDRAM).
///
/// The HD44780U has 80 bytes of DDRAM (Hitachi HD44780U datasheet, "Display
/// Data RAM (DDRAM)", Figures 3–6). With one display line (function set
/// N = 0) they are addresses 0x00…0x4F, in a row. With two lines (N = 1),
/// line 1 is 0x00…0x27 and line 2 is 0x40…0x67, 40 characters each. A 4-row
/// module is a 2-line controller whose rows 3 and 4 are the second halves of
/// lines 1 and 2: a 20×4 has its rows at 0x00, 0x40, 0x14, 0x54 and a 16×4 at
/// 0x00, 0x40, 0x10, 0x50 (datasheet Figure 6 and module data sheets).
///
/// The initialiser takes any numbers (they come from board files); use
/// ``validate()`` or ``isSupported`` before driving a display with them.
public struct LCDGeometry: Sendable, Hashable, CustomStringConvertible {
    /// Characters per row.
    public var columns: Int
    /// Rows of characters (1, 2 or 4 on the usual modules; 3 also maps).
    public var rows: Int

    public init(columns: Int, rows: Int) {
        self.columns = columns
        self.rows = rows
    }

    /// 16 characters × 2 rows, the most common module.
    public static let lcd1602 = LCDGeometry(columns: 16, rows: 2)
    /// 20 characters × 4 rows.
    public static let lcd2004 = LCDGeometry(columns: 20, rows: 4)

    /// Number of character cells.
    public var cellCount: Int { max(columns, 0) * max(rows, 0) }

    /// Whether the controller runs in two-line mode (function set N = 1):
    /// every module with more than one row.
    public var usesTwoLineMode: Bool { rows > 1 }

    /// The DDRAM address of column 0 of each row.
    public var rowOffsets: [UInt8] {
        (0..<max(rows, 0)).map { rowOffset($0) }
    }

    /// The DDRAM address of column 0 of `row`.
    ///
    /// Two-line mode: even rows are on DDRAM line 1 (0x00), odd rows on line 2
    /// (0x40), and every second pair of rows continues its line `columns`
    /// characters further on.
    public func rowOffset(_ row: Int) -> UInt8 {
        guard usesTwoLineMode else { return 0x00 }
        let line = row % 2 == 0 ? 0x00 : 0x40
        return UInt8(truncatingIfNeeded: line + (row / 2) * columns)
    }

    /// The DDRAM address of a cell; `nil` outside the geometry.
    public func address(row: Int, column: Int) -> UInt8? {
        guard (0..<rows).contains(row), (0..<columns).contains(column) else { return nil }
        return rowOffset(row) &+ UInt8(truncatingIfNeeded: column)
    }

    /// Why a geometry cannot be driven.
    public struct ValidationError: Error, Sendable, Hashable, CustomStringConvertible {
        public var geometry: LCDGeometry
        public var reason: String
        public var description: String { "LCD geometry \(geometry): \(reason)" }
    }

    /// Checks that every cell has its own DDRAM address on one controller.
    public func validate() throws {
        guard columns >= 1, (1...4).contains(rows) else {
            throw ValidationError(geometry: self, reason: "needs 1…4 rows of at least one column")
        }
        if usesTwoLineMode {
            // Each DDRAM line holds 40 characters, shared by rows 2 apart.
            let rowsPerLine = (rows + 1) / 2
            guard rowsPerLine * columns <= 40 else {
                throw ValidationError(geometry: self, reason: "\(rowsPerLine) rows of \(columns) do not fit a 40-character DDRAM line")
            }
        } else {
            guard columns <= 80 else {
                throw ValidationError(geometry: self, reason: "one line holds at most 80 characters")
            }
        }
    }

    /// Whether ``validate()`` passes.
    public var isSupported: Bool {
        do {
            try validate()
            return true
        } catch {
            return false
        }
    }

    public var description: String { "\(columns)×\(rows)" }
}
