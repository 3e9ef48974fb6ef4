// swift-tools-version: 6.0
import PackageDescription

// Lower bounds are loose on purpose: Swift 6.0.3 (Debian/Raspberry Pi OS
// trixie) must be able to pick releases it builds; newer toolchains pick newer.
// swift-log's LogEvent (1.12, whose manifest needs tools 6.1) is what the
// daemon's log handler implements from 6.1 on (JournalLogHandler).
#if compiler(>=6.1)
let swiftLogMinimum: Version = "1.12.0"
#else
let swiftLogMinimum: Version = "1.5.0"
#endif
var packageDependencies: [Package.Dependency] = [
    .package(url: "https://github.com/apple/swift-log", from: swiftLogMinimum),
    .package(url: "https://github.com/apple/swift-system", from: "1.3.0"),
]
var protocolTestDependencies: [Target.Dependency] = ["BLEControlProtocol", "TestSupport"]

// swift-property-based only exists for tools 6.1+; with an older toolchain the
// property tests fall back to the package's own seeded generator.
#if compiler(>=6.1)
packageDependencies.append(.package(url: "https://github.com/x-sheep/swift-property-based", from: "2.0.0"))
protocolTestDependencies.append(.product(name: "PropertyBased", package: "swift-property-based"))
#endif

// Release builds for the packages (scripts/install, scripts/build-arm64) set
// BLECONTROL_STATIC_C_LIBS=1: libgpiod and libi2c are then linked from
// their static archives (libgpiod-dev and libi2c-dev ship them), so one
// binary runs on bookworm (libgpiod2) and trixie (libgpiod3) alike and
// the package depends on neither. `-l:libX.a` names the archive itself:
// SwiftPM puts the system library directory first on the search path,
// where libX.so would win over any other directory's libX.a.
func linkC(_ library: String) -> LinkerSetting {
    if Context.environment["BLECONTROL_STATIC_C_LIBS"] == "1" {
        return .unsafeFlags(["-Xlinker", "-l:lib\(library).a"])
    }
    return .linkedLibrary(library)
}

let package = Package(
    name: "BLEControl",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "blecontrold", targets: ["blecontrold"]),
        .executable(name: "blecontrol", targets: ["blecontrol"]),
        .library(name: "BLEControlProtocol", targets: ["BLEControlProtocol"]),
    ],
    dependencies: packageDependencies,
    targets: [
        .target(name: "BLEControlProtocol"),
        // Seeded inputs, a loopback client, a Mosquitto broker rig and
        // made-up GPIO chips (Pi 4 and Pi 5 layouts) shared by tests and
        // benchmarks.
        .target(name: "TestSupport", dependencies: ["LinuxHardware", "Reactor"]),
        .target(name: "Hardware"),
        // epoll, eventfd, signalfd, named threads, monotonic condition
        // variables and priority-inheriting mutexes (glibc, _GNU_SOURCE).
        .target(name: "CReactor"),
        // The one event loop, its timers and clock, threads and locks.
        .target(name: "Reactor", dependencies: [
            "CReactor",
            .product(name: "SystemPackage", package: "swift-system"),
        ]),
        // C views of i2c-dev and libgpiod (from libi2c-dev and libgpiod-dev).
        .target(name: "CLinuxI2C", linkerSettings: [linkC("i2c")]),
        .target(name: "CGPIOD", linkerSettings: [linkC("gpiod")]),
        // libmosquitto, opened with dlopen only when a board file asks for
        // MQTT (Sources/CMosquitto/include/CMosquitto.h says why); dlopen is
        // in libc itself since glibc 2.34 (bookworm has 2.36).
        .target(name: "CMosquitto"),
        // An MQTT 5 client on the event loop, for the daemon's transport and
        // `blecontrol --mqtt`.
        .target(name: "MQTT", dependencies: ["CMosquitto", "Reactor"]),
        // libdbus-1 (libdbus-1-dev) and the BlueZ peripheral built on it.
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),
        // The libdbus-1 binding: connection on the reactor, marshalling,
        // exported objects.
        .target(name: "DBus", dependencies: [
            "CDBus", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "BlueZ", dependencies: [
            "DBus", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The control socket's protocol, its JSON and the client `blecontrol`
        // uses: what the CLI needs of the daemon, without the daemon.
        .target(name: "Control", dependencies: [
            "Reactor",
            .product(name: "SystemPackage", package: "swift-system"),
        ]),
        // The Linux backends of the bus and pin protocols.
        .target(name: "LinuxHardware", dependencies: [
            "Hardware", "CLinuxI2C", "CGPIOD", "CReactor", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "Devices", dependencies: [
            "Hardware", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "DeviceEmulators", dependencies: ["Hardware", "Reactor"]),
        // Board files: the YAML subset, the schema, the validated configuration.
        .target(name: "Board", dependencies: ["Devices", "Hardware", "Reactor"]),
        // The firmware's logic: sessions, the dispatcher, the servo engine and
        // path, the LCD, the switches, the failsafe. No transport, and no real
        // or emulated hardware: it drives whatever buses and lines it is given.
        .target(name: "Firmware", dependencies: [
            "BLEControlProtocol", "Board", "Control", "Hardware", "Devices", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // A board brought to life: its buses and lines opened (Linux's or
        // emulated), the firmware assembled on them, the transports, the
        // control socket, reloads and the outputs record.
        .target(name: "Runtime", dependencies: [
            "BLEControlProtocol", "Board", "Control", "Firmware", "Hardware", "Devices", "DeviceEmulators", "LinuxHardware", "BlueZ", "Reactor", "MQTT",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "SystemPackage", package: "swift-system"),
        ]),
        // Command-line parsing without Foundation, for both executables.
        .target(name: "Arguments"),
        .executableTarget(name: "blecontrold", dependencies: [
            "Arguments", "Board", "Control", "Reactor", "Runtime",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The CLI: the protocol, the control client, the BLE central and the
        // doctor; not the daemon.
        .executableTarget(name: "blecontrol", dependencies: [
            "Arguments", "BLEControlProtocol", "Board", "Central", "Control", "Doctor", "MQTT", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The BLEControl central: bluetoothd's client over D-Bus (scan,
        // connect, write FFE1, notifications), for `blecontrol --ble`.
        .target(name: "Central", dependencies: [
            "DBus", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The diagnosis behind `blecontrol doctor` (the CLI's, not the daemon's).
        .target(name: "Doctor", dependencies: [
            "Board", "CMosquitto", "Control", "DBus", "Devices", "Hardware", "LinuxHardware", "Reactor",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // Interposes malloc to count allocations; linked into the benchmark only.
        .target(name: "CAllocationCounter"),
        .executableTarget(name: "blecontrol-bench", dependencies: [
            "BLEControlProtocol", "Board", "Firmware", "Runtime", "Devices", "DeviceEmulators", "Hardware", "LinuxHardware", "MQTT", "Reactor", "TestSupport", "CAllocationCounter",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "BLEControlProtocolTests", dependencies: protocolTestDependencies, exclude: ["Fixtures"]),
        .testTarget(name: "DeviceEmulatorsTests", dependencies: ["DeviceEmulators", "Hardware"]),
        .testTarget(name: "DevicesTests", dependencies: [
            "Devices", "DeviceEmulators", "Hardware",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "FirmwareTests", dependencies: [
            "Firmware", "Runtime", "Board", "Control", "CReactor", "Reactor", "BLEControlProtocol", "DeviceEmulators", "Devices", "Hardware", "TestSupport",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "BoardTests", dependencies: ["Board", "Devices", "Hardware", "TestSupport"]),
        .testTarget(name: "ReactorTests", dependencies: ["Reactor", "TestSupport"]),
        .testTarget(name: "ControlTests", dependencies: ["Control"]),
        .testTarget(name: "BlueZTests", dependencies: ["BlueZ", "Central", "DBus", "CDBus", "Reactor", "TestSupport"]),
        .testTarget(name: "LinuxHardwareTests", dependencies: ["LinuxHardware", "Hardware", "CLinuxI2C", "TestSupport"]),
        .testTarget(name: "EndToEndTests", dependencies: ["BLEControlProtocol", "TestSupport"]),
        // The doctor's checks in process, against made-up machines.
        .testTarget(name: "DoctorTests", dependencies: ["Doctor", "Board", "LinuxHardware", "Reactor", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)

// The aarch64 tier's test bundle (scripts/build-arm64 sets
// BLECONTROL_ARCH_TESTS=1) holds only the suites whose result can depend on
// the architecture, run there under qemu-user: the C ABI and ioctl
// structures (ReactorTests: epoll_event, which x86_64 packs and aarch64
// does not, signalfd, eventfd, sockets; LinuxHardwareTests: i2c_rdwr and
// the GPIO character device), libdbus's marshalling (BlueZTests),
// libmosquitto's ABI and the threads, priorities and clocks of the servo
// path (FirmwareTests), and the arm64 daemon and CLI as processes: /proc,
// signals, memory locking, stack sizes (EndToEndTests, which start the
// release binaries, so no executable is built in debug). Left to the host,
// each with its reason:
//   BLEControlProtocolTests  byte arithmetic on [UInt8]: every multi-byte
//                            value is assembled with shifts, never by
//                            reinterpreting memory; no C, no I/O
//   BoardTests               text to values (YAML, the schema); no C, no I/O
//   ControlTests             JSON text to values and back
//   DeviceEmulatorsTests     register models in plain Swift
//   DevicesTests             drivers against emulated buses: the byte
//                            sequences they produce, computed in Swift
//   DoctorTests              reads fixture trees (/proc, /sys, config files)
//                            as text
// Under qemu they were the most CPU of the run (the property tests above
// all) and cannot fail on arm64 unless Swift itself does. Without them and
// the programs the cross-compiled test build took 390 s cold, against 526.
if Context.environment["BLECONTROL_ARCH_TESTS"] == "1" {
    let hostOnly: Set<String> = [
        "BLEControlProtocolTests", "BoardTests", "ControlTests", "DeviceEmulatorsTests", "DevicesTests", "DoctorTests",
        // The programs and what only they use.
        "blecontrold", "blecontrol", "blecontrol-bench", "Arguments", "Central", "Doctor", "CAllocationCounter",
    ]
    package.targets.removeAll { hostOnly.contains($0.name) }
    package.products.removeAll { hostOnly.contains($0.name) }
    // BlueZTests stays (libdbus's marshalling), without BLECentralTests: the
    // CLI's central against a fake bluetoothd, the order of its D-Bus calls,
    // over the same marshalling the rest of BlueZTests runs here.
    for target in package.targets where target.name == "BlueZTests" {
        target.dependencies.removeAll { if case .byNameItem(name: "Central", _) = $0 { true } else { false } }
        target.exclude.append("BLECentralTests.swift")
    }
}

// libFuzzer targets (Fuzz/), only when scripts/fuzz asks for them: they are
// built with -sanitize=fuzzer and -parse-as-library, which no other
// executable here survives, and they have no place in a normal build.
if Context.environment["BLECONTROL_FUZZ"] == "1" {
    package.targets += [
        .target(name: "FuzzSupport", path: "Fuzz/support"),
        .executableTarget(name: "fuzz-frames", dependencies: ["BLEControlProtocol", "FuzzSupport"], path: "Fuzz/frames"),
        .executableTarget(name: "fuzz-session", dependencies: [
            "BLEControlProtocol", "Board", "DeviceEmulators", "Devices", "Firmware", "FuzzSupport", "Hardware", "Reactor", "Runtime",
            .product(name: "Logging", package: "swift-log"),
        ], path: "Fuzz/session"),
        .executableTarget(name: "fuzz-board", dependencies: ["Board", "FuzzSupport"], path: "Fuzz/board"),
        .executableTarget(name: "fuzz-serial", dependencies: ["BLEControlProtocol", "Firmware", "FuzzSupport"], path: "Fuzz/serial"),
    ]
}
