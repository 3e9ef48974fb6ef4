#if canImport(Glibc)
import Glibc
#endif

/// Command-line parsing for `blecontrold` and `blecontrol`, in the spirit
/// of swift-argument-parser but without Foundation (which that package
/// pulls in, 8 MB of the static binaries' 15 MB budget): subcommands,
/// `--option VALUE` / `--option=VALUE`, flags, positional arguments,
/// generated `--help`, and exit status 2 with a clear message for anything
/// malformed.
public struct Command {
    /// A `--name VALUE` option.
    public struct Option: Sendable {
        public var name: String
        public var value: String
        public var help: String
        public var hidden: Bool
        /// Other spellings accepted for it (older names): parsed as `name`.
        public var aliases: [String]
        public init(_ name: String, value: String = "VALUE", help: String, hidden: Bool = false, aliases: [String] = []) {
            self.name = name
            self.value = value
            self.help = help
            self.hidden = hidden
            self.aliases = aliases
        }
    }

    /// A `--name` flag.
    public struct Flag: Sendable {
        public var name: String
        public var help: String
        public init(_ name: String, help: String) {
            self.name = name
            self.help = help
        }
    }

    /// A positional argument; `variadic` takes the rest.
    public struct Positional: Sendable {
        public var name: String
        public var help: String
        public var optional: Bool
        public var variadic: Bool
        public init(_ name: String, help: String, optional: Bool = false, variadic: Bool = false) {
            self.name = name
            self.help = help
            self.optional = optional
            self.variadic = variadic
        }
    }

    public var name: String
    public var abstract: String
    public var discussion: String
    public var options: [Option]
    public var flags: [Flag]
    public var positionals: [Positional]
    public var subcommands: [Command]
    /// The subcommand run when none is named (the daemon's `run`).
    public var defaultSubcommand: String?
    /// Command lines to copy, shown right after the abstract in `--help`.
    public var examples: [String]
    public var run: ((Parsed) throws -> Void)?

    public init(_ name: String, abstract: String, examples: [String] = [], discussion: String = "", options: [Option] = [], flags: [Flag] = [],
                positionals: [Positional] = [], subcommands: [Command] = [], defaultSubcommand: String? = nil,
                run: ((Parsed) throws -> Void)? = nil) {
        self.name = name
        self.abstract = abstract
        self.discussion = discussion
        self.examples = examples
        self.options = options
        self.flags = flags
        self.positionals = positionals
        self.subcommands = subcommands
        self.defaultSubcommand = defaultSubcommand
        self.run = run
    }
}

/// What was given on the command line for one command.
public struct Parsed {
    public var options: [String: String] = [:]
    public var flags: Set<String> = []
    public var positionals: [String] = []
    /// The command path, e.g. `blecontrol servo`, for messages.
    public var commandPath: String = ""

    public func option(_ name: String) -> String? { options[name] }
    public func flag(_ name: String) -> Bool { flags.contains(name) }

    /// A positional by index, nil when absent.
    public func positional(_ index: Int) -> String? { index < positionals.count ? positionals[index] : nil }

    /// An option parsed as an integer in `range`, or the default; a bad
    /// value is a usage error.
    public func integer(_ name: String, in range: ClosedRange<Int>, default value: Int) throws -> Int {
        guard let text = options[name] else { return value }
        guard let number = Int(text), range.contains(number) else {
            throw UsageError("--\(name) must be a whole number \(range.lowerBound)…\(range.upperBound), got \(text)")
        }
        return number
    }
}

/// A malformed command line: printed with a hint, exit status 2.
public struct UsageError: Error, CustomStringConvertible {
    public var description: String
    /// The command whose `--help` answers it (`blecontrol status`), set
    /// where the command line was read.
    public var commandPath: String?
    public init(_ description: String) { self.description = description }
}

/// A failure the user should read (printed as is), with an exit status.
public struct ExitFailure: Error, CustomStringConvertible {
    public var description: String
    public var status: Int32
    public init(_ description: String, status: Int32 = 1) {
        self.description = description
        self.status = status
    }

    /// Exit with `status` and print nothing more.
    public static func silent(_ status: Int32) -> ExitFailure { ExitFailure("", status: status) }
}

extension Command {
    /// Parses `arguments` (without the program name), runs the command and
    /// exits: 0 on success, 2 for usage errors, the thrown status otherwise.
    /// `--manual-page` alone prints the manual page made from this tree
    /// and `manual`; with `completion: true` the program also has a
    /// `completion bash` command printing its bash completion script.
    public func main(arguments: [String] = Array(CommandLine.arguments.dropFirst()), version: String,
                     manual: Manual? = nil, completion: Bool = false) -> Never {
        var root = self
        if completion { root.subcommands.append(completionCommand()) }
        do {
            if let manual, arguments == ["--manual-page"] {
                print(root.manualPage(manual, version: version), terminator: "")
                exit(0)
            }
            try root.dispatch(arguments, path: name, version: version)
            exit(0)
        } catch let error as UsageError {
            printError("\(name): \(error.description)\n(`\(error.commandPath ?? name) --help` lists its options)")
            exit(2)
        } catch let failure as ExitFailure {
            if !failure.description.isEmpty { printError(failure.description) }
            exit(failure.status)
        } catch {
            printError("\(name): \(error)")
            exit(1)
        }
    }

    private func dispatch(_ arguments: [String], path: String, version: String) throws {
        if let (index, sub) = subcommandWord(in: arguments) {
            // Options may come before the command's name (`blecontrol --ble
            // BOARD servo 0 500`): they are the command's all the same.
            var rest = arguments
            rest.remove(at: index)
            return try sub.dispatch(rest, path: "\(path) \(sub.name)", version: version)
        }
        if arguments.contains("--help") || arguments.contains("-h") {
            print(help(path: path), terminator: "")
            return
        }
        if arguments.first == "--version" {
            print(version)
            return
        }
        if let defaultName = defaultSubcommand, let sub = subcommands.first(where: { $0.name == defaultName }) {
            return try sub.dispatch(arguments, path: path, version: version)
        }
        guard let run else {
            if let first = arguments.first { throw UsageError("unknown command \(first) (\(subcommands.map(\.name).joined(separator: ", ")))") }
            print(help(path: path), terminator: "")
            throw ExitFailure.silent(2)
        }
        do {
            var parsed = try parse(arguments)
            parsed.commandPath = path
            try run(parsed)
        } catch var error as UsageError {
            // The help that lists this command's options, not its parent's.
            if error.commandPath == nil { error.commandPath = path }
            throw error
        }
    }

    /// The first word naming a subcommand with nothing before it but that
    /// subcommand's options (and their values).
    private func subcommandWord(in arguments: [String]) -> (Int, Command)? {
        for (index, word) in arguments.enumerated() where !word.hasPrefix("-") {
            guard let sub = subcommands.first(where: { $0.name == word }) else { continue }
            var before = 0
            while before < index, arguments[before].hasPrefix("--") {
                let text = arguments[before].dropFirst(2)
                let name = String(text.prefix { $0 != "=" })
                if sub.options.contains(where: { $0.name == name || $0.aliases.contains(name) }) {
                    before += text.contains("=") ? 1 : 2
                } else if sub.flags.contains(where: { $0.name == name }) {
                    before += 1
                } else {
                    break
                }
            }
            if before == index { return (index, sub) }
        }
        return nil
    }

    /// Splits arguments into options, flags and positionals.
    public func parse(_ arguments: [String]) throws -> Parsed {
        var parsed = Parsed()
        var index = 0
        var onlyPositionals = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if onlyPositionals || !argument.hasPrefix("--") || argument == "-" {
                // A lone negative number is a value, not an option.
                if !onlyPositionals, argument.hasPrefix("-"), argument.count > 1, Int(argument) == nil {
                    throw UsageError("unknown option \(argument)")
                }
                parsed.positionals.append(argument)
                continue
            }
            if argument == "--" {
                onlyPositionals = true
                continue
            }
            var name = String(argument.dropFirst(2))
            var inlineValue: String?
            if let equals = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            if flags.contains(where: { $0.name == name }) {
                guard inlineValue == nil else { throw UsageError("--\(name) takes no value") }
                parsed.flags.insert(name)
            } else if let option = options.first(where: { $0.name == name || $0.aliases.contains(name) }) {
                name = option.name
                let value: String
                if let inlineValue {
                    value = inlineValue
                } else {
                    guard index < arguments.count else { throw UsageError("--\(name) needs a value") }
                    value = arguments[index]
                    index += 1
                }
                parsed.options[name] = value
            } else {
                throw UsageError("unknown option --\(name)")
            }
        }
        let required = positionals.filter { !$0.optional && !$0.variadic }.count
        if parsed.positionals.count < required {
            let missing = positionals[parsed.positionals.count]
            throw UsageError("missing <\(missing.name)> (\(missing.help))")
        }
        if !positionals.contains(where: \.variadic), parsed.positionals.count > positionals.count {
            throw UsageError("unexpected argument \(parsed.positionals[positionals.count])")
        }
        return parsed
    }

    /// The `--help` text: what it does and an example first, then the
    /// arguments and options, then the subcommands. A command with a
    /// default subcommand (the daemon's `run`) shows that one's arguments
    /// and options too: they are what its users type.
    public func help(path: String) -> String {
        var text = "\(abstract)\n"
        if !examples.isEmpty {
            text += "\nexample\(examples.count == 1 ? "" : "s"):\n" + examples.map { "  \($0)\n" }.joined()
        }
        text += "\n\(usage(path: path))\n"
        if !discussion.isEmpty { text += "\n" + wrap(discussion, indent: "") + "\n" }
        text += argumentsAndOptions(heading: "")
        if let defaultName = defaultSubcommand, let sub = subcommands.first(where: { $0.name == defaultName }) {
            text += "\n" + wrap("Without a command, as `\(path) \(sub.name)`: \(sub.abstract)", indent: "") + "\n"
            if !sub.examples.isEmpty { text += "\nexample\(sub.examples.count == 1 ? "" : "s"):\n" + sub.examples.map { "  \($0)\n" }.joined() }
            text += "\n\(sub.usage(path: path))\n"
            text += sub.argumentsAndOptions(heading: " (\(sub.name))")
        }
        if !subcommands.isEmpty {
            text += "\ncommands:\n"
            for sub in subcommands { text += row(sub.name + (sub.name == defaultSubcommand ? " (default)" : ""), sub.abstract) }
            text += "\n`\(path) <command> --help` shows a command's options.\n"
        }
        return text
    }

    private func usage(path: String) -> String {
        var usage = "usage: \(path)"
        if !subcommands.isEmpty { usage += defaultSubcommand == nil ? " <command>" : " [<command>]" }
        if !options.filter({ !$0.hidden }).isEmpty || !flags.isEmpty { usage += " [options]" }
        for positional in positionals {
            let name = positional.variadic ? "<\(positional.name)>…" : "<\(positional.name)>"
            usage += positional.optional || positional.variadic ? " [\(name)]" : " \(name)"
        }
        return usage
    }

    /// The arguments, then the flags (a command's own switches, such as
    /// `--raw`), then the options (mostly where to send: `--socket`,
    /// `--ble`, `--mqtt`).
    private func argumentsAndOptions(heading: String) -> String {
        var text = ""
        if !positionals.isEmpty {
            text += "\narguments\(heading):\n"
            for positional in positionals { text += row("<\(positional.name)>", positional.help) }
        }
        let visible = options.filter { !$0.hidden }
        if !visible.isEmpty || !flags.isEmpty {
            text += "\noptions\(heading):\n"
            for flag in flags { text += row("--\(flag.name)", flag.help) }
            for option in visible { text += row("--\(option.name) <\(option.value)>", option.help) }
            text += row("-h, --help", "Show this help.")
        }
        return text
    }

    private func row(_ left: String, _ right: String) -> String {
        let pad = 26
        let head = "  " + left
        let body = wrap(right, indent: String(repeating: " ", count: pad + 2))
        if head.count < pad + 2 {
            return head + String(repeating: " ", count: pad + 2 - head.count) + body.dropFirst(pad + 2) + "\n"
        }
        return head + "\n" + body + "\n"
    }

    private func wrap(_ text: String, indent: String, width: Int = 79) -> String {
        var lines: [String] = []
        var line = indent
        for word in text.split(separator: " ", omittingEmptySubsequences: true) {
            if line.count > indent.count, line.count + 1 + word.count > width {
                lines.append(line)
                line = indent
            }
            line += (line.count > indent.count ? " " : "") + word
        }
        lines.append(line)
        return lines.joined(separator: "\n")
    }
}

/// Writes a line to standard error.
public func printError(_ text: String) {
    let line = Array((text + "\n").utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}
