/// Shell completion made from the command tree, so it offers exactly the
/// commands and options the parser accepts.
extension Command {
    /// `PROGRAM completion bash`: prints the script (the package installs
    /// its output in /usr/share/bash-completion/completions).
    func completionCommand() -> Command {
        Command(
            "completion",
            abstract: "Print the bash completion script (the package installs it; source it in a shell to try it).",
            positionals: [Positional("shell", help: "bash.")]
        ) { arguments in
            guard arguments.positionals == ["bash"] else { throw UsageError("completion knows bash") }
            // The tree as main() sees it, this command included.
            var root = self
            root.subcommands.append(Command("completion", abstract: "", positionals: [Positional("shell", help: "")]))
            print(root.bashCompletion(), terminator: "")
        }
    }

    /// A bash completion function for this program: subcommands first,
    /// then each one's options; values by what they name (files for
    /// PATH/FILE/DIR, the adapters for hciN, on/off for a state).
    public func bashCompletion() -> String {
        let function = "_" + name.map { $0.isLetter || $0.isNumber ? String($0) : "_" }.joined()
        let visible = subcommands.map(\.name)
        // Values of options, whatever the command.
        var fileOptions: Set<String> = []
        var adapterOptions: Set<String> = []
        var valueOptions: Set<String> = []
        for command in [self] + subcommands {
            for option in command.options where !option.hidden {
                let names = ([option.name] + option.aliases).map { "--\($0)" }
                switch option.value {
                case "PATH", "FILE", "DIR": fileOptions.formUnion(names)
                case "hciN": adapterOptions.formUnion(names)
                default: valueOptions.formUnion(names)
                }
            }
        }
        let valued = fileOptions.union(adapterOptions).union(valueOptions).sorted().joined(separator: "|")
        // The command is the first word that is neither an option nor an
        // option's value (options may come before it).
        var script = """
        # bash completion for \(name); made by `\(name) completion bash` from
        # the same command tree as its --help.
        \(function)() {
            local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
            local command="" i
            for ((i = 1; i < COMP_CWORD; i++)); do
                case ${COMP_WORDS[i]} in
                \(valued.isEmpty ? "--" : valued)) ((i++)) ;;
                -*) ;;
                *) command=${COMP_WORDS[i]}; break ;;
                esac
            done

        """
        script += "    case $prev in\n"
        if !fileOptions.isEmpty {
            script += "    \(fileOptions.sorted().joined(separator: "|"))) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
        }
        if !adapterOptions.isEmpty {
            script += "    \(adapterOptions.sorted().joined(separator: "|"))) COMPREPLY=($(compgen -W \"$(ls /sys/class/bluetooth 2>/dev/null)\" -- \"$cur\")); return ;;\n"
        }
        if !valueOptions.isEmpty {
            // A number, an address, a name: nothing to offer.
            script += "    \(valueOptions.sorted().joined(separator: "|"))) return ;;\n"
        }
        script += "    esac\n"

        script += "    case $command in\n"
        let rootWords = visible + (defaultSubcommand == nil ? [] : words(of: subcommands.first { $0.name == defaultSubcommand }!)) + ["--help", "--version"]
        script += "    \"\") COMPREPLY=($(compgen -W \"\(rootWords.joined(separator: " "))\" -- \"$cur\")) ;;\n"
        for sub in subcommands {
            var values: [String] = []
            if sub.positionals.contains(where: { $0.name == "state" }) { values += ["on", "off"] }
            if sub.name == "completion" { values += ["bash"] }
            script += "    \(sub.name)) COMPREPLY=($(compgen -W \"\((words(of: sub) + values).joined(separator: " "))\" -- \"$cur\")) ;;\n"
        }
        script += "    esac\n}\ncomplete -F \(function) \(name)\n"
        return script
    }

    private func words(of command: Command) -> [String] {
        command.options.filter { !$0.hidden }.map { "--\($0.name)" } + command.flags.map { "--\($0.name)" } + ["--help"]
    }
}
