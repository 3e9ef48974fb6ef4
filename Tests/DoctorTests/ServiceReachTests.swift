@testable import Doctor
import Testing

@Suite("blecontrol doctor: what blecontrold.service can reach, not what doctor can")
struct ServiceReachTests {
    static let unitPath = "/usr/lib/systemd/system/blecontrold.service"

    /// The unit as shipped before MQTT worked under it: loopback only.
    static func loopbackOnlyUnit(_ machine: MadeUpMachine) throws {
        try machine.write(unitPath, """
            [Unit]
            Description=BLEControl board firmware

            [Service]
            User=blecontrol
            ExecStart=/usr/bin/blecontrold run --board /etc/blecontrol/board.yaml
            IPAddressDeny=any
            IPAddressAllow=localhost

            [Install]
            WantedBy=multi-user.target

            """)
    }

    @Test("A unit that denies the broker: the service cannot reach it, with the line that denies it and the drop-in that fixes it")
    func denied() throws {
        let machine = try MadeUpMachine()
        try Self.loopbackOnlyUnit(machine)
        let finding = try #require(context(machine).serviceReach(host: "192.168.1.2", port: 1883))
        #expect(finding.subject == "MQTT broker 192.168.1.2:1883 from blecontrold.service")
        #expect(finding.level == .fail)
        #expect(finding.detail.hasPrefix("the service cannot reach 192.168.1.2: IPAddressDeny=any in \(Self.unitPath)"), "\(finding.detail)")
        #expect(finding.detail.contains("IPAddressAllow=localhost in \(Self.unitPath)"), "\(finding.detail)")
        let fix = try #require(finding.fix)
        #expect(fix.contains("sudo systemctl edit blecontrold") && fix.contains("IPAddressAllow=192.168.1.2") && fix.contains("192.168.1.0/24"), "\(fix)")

        for host in ["2001:db8::7"] {
            #expect(context(machine).serviceReach(host: host, port: 1883)?.level == .fail, "\(host)")
        }
        for host in ["127.0.0.1", "::1"] {
            let loopback = try #require(context(machine).serviceReach(host: host, port: 1883))
            #expect(loopback.level == .ok && loopback.detail.contains("IPAddressAllow=localhost in \(Self.unitPath) allows it"), "\(host): \(loopback.detail)")
        }
        // A masked unit, or none, is not judged.
        try machine.link("/etc/systemd/system/blecontrold.service", to: "/dev/null")
        #expect(context(machine).serviceReach(host: "192.168.1.2", port: 1883) == nil)
        #expect(context(try MadeUpMachine()).serviceReach(host: "192.168.1.2", port: 1883) == nil)
    }

    @Test("A unit that allows the broker: by IPAddressAllow= with its network in a drop-in, with no IPAddress lines, or with the deny list reset")
    func allowed() throws {
        let machine = try MadeUpMachine()
        try Self.loopbackOnlyUnit(machine)
        let dropIn = "/etc/systemd/system/blecontrold.service.d/mqtt.conf"
        try machine.write(dropIn, "[Service]\nIPAddressAllow=192.168.1.0/24\n")
        let network = try #require(context(machine).serviceReach(host: "192.168.1.2", port: 1883))
        #expect(network.level == .ok && network.detail.contains("IPAddressAllow=192.168.1.0/24 in \(dropIn) allows it"), "\(network.detail)")
        #expect(context(machine).serviceReach(host: "192.168.2.2", port: 1883)?.level == .fail)

        // systemctl set-property's drop-in, read with the others.
        try machine.remove(dropIn)
        try machine.write("/etc/systemd/system.control/blecontrold.service.d/50-IPAddressDeny.conf", "[Service]\nIPAddressDeny=\n")
        let reset = try #require(context(machine).serviceReach(host: "192.168.1.2", port: 1883))
        #expect(reset.level == .ok && reset.detail.contains("no IPAddressDeny= names it"), "\(reset.detail)")

        let open = try MadeUpMachine()
        try open.write(Self.unitPath, "[Service]\nExecStart=/usr/bin/blecontrold run\n")
        let none = try #require(context(open).serviceReach(host: "192.168.1.2", port: 1883))
        #expect(none.level == .ok && none.detail.contains("sets no IPAddressAllow= or IPAddressDeny="), "\(none.detail)")

        try open.write("/usr/lib/systemd/system/blecontrold.service.d/private.conf", "[Service]\nPrivateNetwork=yes\n")
        let isolated = try #require(context(open).serviceReach(host: "127.0.0.1", port: 1883))
        #expect(isolated.level == .fail && isolated.detail.contains("PrivateNetwork=yes in /usr/lib/systemd/system/blecontrold.service.d/private.conf"), "\(isolated.detail)")
    }

    @Test("A broker by name: its addresses are judged, and the name servers the service would ask")
    func byName() throws {
        let machine = try MadeUpMachine()
        try Self.loopbackOnlyUnit(machine)
        try machine.write("/etc/hosts", "127.0.0.1 localhost\n")
        try machine.write("/etc/resolv.conf", "# from DHCP\nnameserver 192.168.1.1\n")
        let hosts = try #require(context(machine).serviceReach(host: "localhost", port: 1883))
        #expect(hosts.level == .ok && hosts.detail.contains("localhost ("), "\(hosts.detail)")

        try machine.write("/etc/hosts", "")
        let dns = try #require(context(machine).serviceReach(host: "localhost", port: 1883))
        #expect(dns.level == .warn && dns.detail.contains("not ask the name server 192.168.1.1 (IPAddressDeny=any in \(Self.unitPath))"), "\(dns.detail)")
    }
}
