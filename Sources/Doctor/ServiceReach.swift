#if canImport(Glibc)
import Glibc
#endif
import Reactor

/// An IP network as systemd's IPAddressAllow= and IPAddressDeny= name one
/// (systemd.resource-control(5)): an address with an optional prefix
/// length, IPv4 or IPv6.
struct IPPrefix: Equatable {
    /// 4 or 16 bytes, network order.
    var address: [UInt8]
    var length: Int

    /// Whether `address` (4 or 16 bytes) is in this network; an IPv4
    /// address is never in an IPv6 network, nor the other way round.
    func contains(_ other: [UInt8]) -> Bool {
        guard other.count == address.count else { return false }
        var remaining = length
        for (mine, theirs) in zip(address, other) where remaining > 0 {
            let bits = min(remaining, 8)
            let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - bits))
            if mine & mask != theirs & mask { return false }
            remaining -= bits
        }
        return true
    }

    /// The networks one word of an IPAddressAllow=/IPAddressDeny= list
    /// stands for; empty for a word systemd would refuse too.
    static func parse(_ word: String) -> [IPPrefix] {
        switch word {
        case "any": return [IPPrefix(address: [0, 0, 0, 0], length: 0), IPPrefix(address: [UInt8](repeating: 0, count: 16), length: 0)]
        case "localhost": return [IPPrefix(address: [127, 0, 0, 0], length: 8), IPPrefix(address: [UInt8](repeating: 0, count: 15) + [1], length: 128)]
        case "link-local": return [IPPrefix(address: [169, 254, 0, 0], length: 16), IPPrefix(address: [0xFE, 0x80] + [UInt8](repeating: 0, count: 14), length: 64)]
        case "multicast": return [IPPrefix(address: [224, 0, 0, 0], length: 4), IPPrefix(address: [0xFF] + [UInt8](repeating: 0, count: 15), length: 8)]
        default: break
        }
        let parts = word.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        guard let address = Self.address(parts[0]) else { return [] }
        let maximum = address.count * 8
        guard parts.count == 2 else { return [IPPrefix(address: address, length: maximum)] }
        guard let length = Int(parts[1]), (0...maximum).contains(length) else { return [] }
        return [IPPrefix(address: address, length: length)]
    }

    /// The bytes of an IPv4 or IPv6 literal, nil for anything else.
    static func address(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }

    /// `192.168.1.2`, `fe80::1`.
    static func text(_ address: [UInt8]) -> String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = address.count == 4 ? AF_INET : AF_INET6
        let written = address.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &buffer, socklen_t(buffer.count)) }
        guard written != nil else { return address.map { String($0) }.joined(separator: ".") }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// A unit's IP firewall: what its IPAddressAllow= and IPAddressDeny=
/// lists, drop-ins included, let its processes reach. An address is
/// allowed when it is in the allow list, else denied when it is in the deny
/// list, else allowed (systemd.resource-control(5)). Each list grows with
/// every assignment; an empty one empties it.
struct IPAddressFilter {
    /// One word of a list, as written, where it was written.
    struct Entry {
        var key: String
        var word: String
        var file: String
        var networks: [IPPrefix]

        /// `IPAddressDeny=any in /usr/lib/systemd/system/blecontrold.service`.
        var description: String { "\(key)=\(word) in \(file)" }
    }

    var allow: [Entry] = []
    var deny: [Entry] = []

    init(_ assignments: [(key: String, setting: SystemdSetting)]) {
        for (key, setting) in assignments {
            let name: String
            switch key {
            case "Service.IPAddressAllow": name = "IPAddressAllow"
            case "Service.IPAddressDeny": name = "IPAddressDeny"
            default: continue
            }
            let words = setting.value.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
            let entries = words.map { Entry(key: name, word: $0, file: setting.file, networks: IPPrefix.parse($0)) }
            if name == "IPAddressAllow" {
                allow = words.isEmpty ? [] : allow + entries
            } else {
                deny = words.isEmpty ? [] : deny + entries
            }
        }
    }

    var isEmpty: Bool { allow.isEmpty && deny.isEmpty }

    /// The entry that allows `address`, or the one that denies it; nil
    /// when neither list names it (allowed).
    func verdict(_ address: [UInt8]) -> (allowed: Bool, by: Entry?) {
        if let entry = allow.first(where: { $0.networks.contains { $0.contains(address) } }) { return (true, entry) }
        if let entry = deny.first(where: { $0.networks.contains { $0.contains(address) } }) { return (false, entry) }
        return (true, nil)
    }
}

extension SystemInspector {
    /// The addresses `host` resolves to for a TCP connection (a literal is
    /// itself), or why it does not resolve.
    public static func addresses(of host: String) -> Result<[[UInt8]], ResolutionFailure> {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &list)
        guard status == 0 else { return .failure(ResolutionFailure(description: String(cString: gai_strerror(status)))) }
        defer { freeaddrinfo(list) }
        var addresses: [[UInt8]] = []
        var entry = list
        while let current = entry {
            let info = current.pointee
            var bytes: [UInt8]?
            if info.ai_family == AF_INET {
                bytes = info.ai_addr.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin_addr) { Array($0) }
                }
            } else if info.ai_family == AF_INET6 {
                bytes = info.ai_addr.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin6_addr) { Array($0) }
                }
            }
            if let bytes, !addresses.contains(bytes) { addresses.append(bytes) }
            entry = info.ai_next
        }
        return .success(addresses)
    }

    public struct ResolutionFailure: Error, CustomStringConvertible {
        public var description: String
    }
}

extension Context {
    /// Whether blecontrold, run by its unit, may connect to `host`: the
    /// unit's PrivateNetwork= and IP firewall judged against the addresses
    /// `host` resolves to. Doctor's own connection says nothing about that:
    /// it does not run inside the unit's sandbox. nil when the unit is not
    /// installed. (The firewall of the slices above the unit is not read:
    /// this project's units set none.)
    func serviceReach(host: String, port: UInt16) -> DoctorFinding? {
        guard let assignments = system.unitAssignments(Self.serviceUnit) else { return nil }
        let subject = "MQTT broker \(host):\(port) from \(Self.serviceUnit)"
        let level: DoctorLevel = isRealBoard ? .fail : .warn
        let dropIn = "`sudo systemctl edit blecontrold`, add `[Service]` and"
        let restart = "then `sudo systemctl restart blecontrold`"
        if let privateNetwork = assignments.last(where: { $0.key == "Service.PrivateNetwork" })?.setting,
           ["yes", "true", "on", "1"].contains(privateNetwork.value.lowercased()) {
            return DoctorFinding(
                level, subject, "the service cannot reach \(host): PrivateNetwork=\(privateNetwork.value) in \(privateNetwork.file) gives it no network but its own loopback",
                fix: "\(dropIn) `PrivateNetwork=no`, \(restart)"
            )
        }
        let filter = IPAddressFilter(assignments)
        guard !filter.isEmpty else {
            return DoctorFinding(.ok, subject, "the unit sets no IPAddressAllow= or IPAddressDeny=: the service may connect to it")
        }
        let addresses: [[UInt8]]
        switch SystemInspector.addresses(of: host) {
        case .success(let found) where !found.isEmpty: addresses = found
        case .success: return DoctorFinding(.warn, subject, "\(host) resolves to no address here: the unit's IP firewall is not judged")
        case .failure(let why): return DoctorFinding(.warn, subject, "cannot resolve \(host) (\(why)): the unit's IP firewall is not judged")
        }
        let named = IPPrefix.address(host) == nil
        let inHosts = (system.read("/etc/hosts") ?? "").split(separator: "\n").contains { line in
            line.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0]
                .split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst()
                .contains { $0.lowercased() == host.lowercased() }
        }
        let verdicts = addresses.map { (address: IPPrefix.text($0), verdict: filter.verdict($0)) }
        // A name is resolved by the service itself: through the name
        // servers of resolv.conf unless /etc/hosts has it.
        let deniedServers = !named || inHosts ? [] : (system.read("/etc/resolv.conf") ?? "").split(separator: "\n").compactMap { line -> String? in
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard words.count >= 2, words[0] == "nameserver", let address = IPPrefix.address(String(words[1])) else { return nil }
            let verdict = filter.verdict(address)
            return verdict.allowed ? nil : "\(words[1]) (\(verdict.by?.description ?? "denied"))"
        }
        if let reached = verdicts.first(where: \.verdict.allowed) {
            let why = reached.verdict.by.map { "\($0.description) allows it" } ?? "no IPAddressDeny= names it"
            let connect = "the unit's IP firewall lets the service connect to \(named ? "\(host) (\(reached.address))" : host): \(why)"
            guard deniedServers.isEmpty else {
                return DoctorFinding(
                    .warn, subject, "\(connect), but not ask the name server\(deniedServers.count == 1 ? "" : "s") \(deniedServers.joined(separator: ", ")) for it",
                    fix: "name the broker by its address in the board file, or put it in /etc/hosts, or \(dropIn) `IPAddressAllow=` with the name server, \(restart)"
                )
            }
            return DoctorFinding(.ok, subject, connect)
        }
        let refusals = verdicts.map { "\($0.address): \($0.verdict.by?.description ?? "denied")" }
        let allowed = filter.allow.isEmpty ? "" : "; the allow list (\(filter.allow.map(\.description).joined(separator: ", "))) does not include \(addresses.count == 1 ? "it" : "them")"
        let network = addresses.first.map { $0.count == 4 ? IPPrefix.text(Array($0.prefix(3)) + [0]) + "/24" : IPPrefix.text($0) } ?? host
        return DoctorFinding(
            level, subject,
            "the service cannot reach \(named ? "\(host) (\(refusals.joined(separator: "; ")))" : refusals.joined(separator: "; "))\(allowed)",
            fix: "\(dropIn) `IPAddressAllow=\(addresses.map(IPPrefix.text).joined(separator: " "))` (or the broker's network, e.g. \(network)), \(restart)"
        )
    }
}
