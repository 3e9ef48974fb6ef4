/// A manual page made from the same command tree as `--help` (the names,
/// the abstracts, the options and their help), plus the sections a command
/// tree does not hold: exit statuses, signals, files, examples.
/// `PROGRAM --manual-page` prints it (roff, man(7) macros); the package
/// installs what that printed, and a test keeps the two equal.
public struct Manual: Sendable {
    /// A piece of a section's text. Text is plain: `backquoted` words are
    /// set in bold, everything else is escaped for roff.
    public enum Block: Sendable {
        case paragraph(String)
        /// A tagged paragraph: a term and what it means.
        case item(String, String)
        /// Lines shown as typed.
        case example([String])
    }

    public struct Section: Sendable {
        public var title: String
        public var blocks: [Block]
        public init(_ title: String, _ blocks: [Block]) {
            self.title = title
            self.blocks = blocks
        }
    }

    /// 1 for user commands, 8 for the daemon.
    public var section: Int
    /// The sections after DESCRIPTION and the commands, in order.
    public var sections: [Section]

    public init(section: Int, sections: [Section]) {
        self.section = section
        self.sections = sections
    }
}

extension Command {
    /// The roff source of this program's manual page.
    public func manualPage(_ manual: Manual, version: String) -> String {
        let kind = manual.section == 8 ? "System Administration" : "User Commands"
        var page = ".TH \(name.uppercased()) \(manual.section) \"\" \"\(name) \(version)\" \"\(kind)\"\n"
        page += ".nh\n.ad l\n"
        page += ".SH NAME\n\(roff(name)) \\- \(roff(lowercasedFirst(abstract.trimmingFinalPeriod)))\n"

        page += ".SH SYNOPSIS\n"
        for command in documentedCommands {
            page += ".B \(roff(command.path))\n"
            let synopsis = command.command.synopsisWords(isDefault: command.isDefault)
            if !synopsis.isEmpty { page += roff(synopsis) + "\n" }
            page += ".br\n"
        }

        // A program with a default command (the daemon's run) is described
        // by that command's text.
        let described = subcommands.first { $0.name == defaultSubcommand } ?? self
        page += ".SH DESCRIPTION\n\(roff(described.abstract))\n"
        if !described.discussion.isEmpty { page += ".PP\n\(roff(described.discussion))\n" }

        if subcommands.isEmpty {
            page += optionsSection(of: self)
        } else {
            page += ".SH COMMANDS\n"
            for command in documentedCommands {
                page += ".SS \"\(roff(command.path))\"\n"
                if !command.isDefault {
                    page += "\(roff(command.command.abstract))\n"
                    if !command.command.discussion.isEmpty { page += ".PP\n\(roff(command.command.discussion))\n" }
                }
                page += command.command.argumentItems()
            }
        }
        for section in manual.sections {
            page += ".SH \(roff(section.title.uppercased()))\n"
            for (index, block) in section.blocks.enumerated() {
                switch block {
                case .paragraph(let text):
                    if index > 0 { page += ".PP\n" }
                    page += roff(text) + "\n"
                case .item(let term, let text):
                    page += ".TP\n\\fB\(roff(term))\\fR\n\(roff(text))\n"
                case .example(let lines):
                    page += ".PP\n.RS 4\n.nf\n" + lines.map { "\\f(CR\(roff($0, backquotes: false))\\fR" }.joined(separator: "\n") + "\n.fi\n.RE\n"
                }
            }
        }
        return page
    }

    /// Each command a user types, with the words that name it: the program
    /// itself when it has no subcommands, else each subcommand (the default
    /// one first).
    private var documentedCommands: [(path: String, command: Command, isDefault: Bool)] {
        if subcommands.isEmpty { return [(name, self, false)] }
        var result: [(path: String, command: Command, isDefault: Bool)] = []
        for sub in subcommands where sub.name == defaultSubcommand { result.append((name, sub, true)) }
        for sub in subcommands where sub.name != defaultSubcommand { result.append(("\(name) \(sub.name)", sub, false)) }
        return result
    }

    private func optionsSection(of command: Command) -> String {
        let items = command.argumentItems()
        return items.isEmpty ? "" : ".SH OPTIONS\n" + items
    }

    /// `[options] <positional>…` as in the usage line.
    fileprivate func synopsisWords(isDefault: Bool) -> String {
        var words: [String] = []
        if isDefault { words.append("[\(name)]") }
        if !options.filter({ !$0.hidden }).isEmpty || !flags.isEmpty { words.append("[options]") }
        for positional in positionals {
            let word = positional.variadic ? "\(positional.name)…" : positional.name
            words.append(positional.optional || positional.variadic ? "[\(word)]" : word)
        }
        return words.joined(separator: " ")
    }

    /// The positionals, options and flags as tagged paragraphs.
    fileprivate func argumentItems() -> String {
        var text = ""
        for positional in positionals {
            text += ".TP\n\\fI\(roff(positional.name))\\fR\n\(roff(positional.help))\n"
        }
        for option in options where !option.hidden {
            text += ".TP\n\\fB\\-\\-\(roff(option.name))\\fR \\fI\(roff(option.value))\\fR\n\(roff(option.help))"
            if !option.aliases.isEmpty {
                text += " " + roff("(Also " + option.aliases.map { "`--\($0)`" }.joined(separator: ", ") + ".)")
            }
            text += "\n"
        }
        for flag in flags {
            text += ".TP\n\\fB\\-\\-\(roff(flag.name))\\fR\n\(roff(flag.help))\n"
        }
        return text
    }
}

/// Text escaped for roff: backslashes, dashes (an ASCII minus, as typed),
/// a period or quote that would start a request, characters beyond ASCII
/// by their Unicode names; `backquoted` words in bold.
func roff(_ text: String, backquotes: Bool = true) -> String {
    var result = ""
    var bold = false
    var lineStart = true
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\\": result += "\\e"
        case "-": result += "\\-"
        case "`" where backquotes:
            result += bold ? "\\fR" : "\\fB"
            bold.toggle()
        case "\n": result += "\n"
        case "." where lineStart, "'" where lineStart: result += "\\&" + String(scalar)
        default:
            if scalar.value < 0x80 {
                result.unicodeScalars.append(scalar)
            } else {
                let hex = String(scalar.value, radix: 16, uppercase: true)
                result += "\\[u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex + "]"
            }
        }
        lineStart = scalar == "\n"
    }
    if bold { result += "\\fR" }
    return result
}

private func lowercasedFirst(_ text: String) -> String {
    guard let first = text.first else { return text }
    // Keep names and acronyms (BLEControl, BLE) as they are.
    if let second = text.dropFirst().first, second.isUppercase { return text }
    return first.lowercased() + text.dropFirst()
}

extension String {
    fileprivate var trimmingFinalPeriod: String { hasSuffix(".") ? String(dropLast()) : self }
}
