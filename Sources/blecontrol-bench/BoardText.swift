extension String {
    /// This board file's text with every `pattern` replaced: how a bench
    /// makes its variant of the simulator board. A pattern the text no
    /// longer holds stops the bench, which would otherwise measure a board
    /// other than the one it names (board/simulator.yaml edited since).
    func board(replacing pattern: String, with replacement: String) -> String {
        guard contains(pattern) else {
            fatalError("blecontrol-bench: the board text no longer has \"\(pattern)\" (was board/simulator.yaml edited?)")
        }
        return replacingOccurrences(of: pattern, with: replacement)
    }
}
