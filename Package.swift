// swift-tools-version: 6.0
import PackageDescription

// Lower bounds are loose on purpose: Swift 6.0.3 (Debian/Raspberry Pi OS
// trixie) must be able to pick releases it builds; newer toolchains pick newer.
var packageDependencies: [Package.Dependency] = [
    .package(url: "https://github.com/apple/swift-argument-parser", from: "1.3.0"),
    .package(url: "https://github.com/apple/swift-log", from: "1.5.0"),
    .package(url: "https://github.com/apple/swift-system", from: "1.3.0"),
    .package(url: "https://github.com/jpsim/Yams", from: "5.0.0"),
]
var protocolTestDependencies: [Target.Dependency] = ["BLEControlProtocol", "TestSupport"]

// swift-property-based only exists for tools 6.1+; with an older toolchain the
// property tests fall back to the package's own seeded generator.
#if compiler(>=6.1)
packageDependencies.append(.package(url: "https://github.com/x-sheep/swift-property-based", from: "2.0.0"))
protocolTestDependencies.append(.product(name: "PropertyBased", package: "swift-property-based"))
#endif

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
        // Seeded inputs and a loopback client shared by tests and benchmarks.
        .target(name: "TestSupport"),
        .target(name: "Hardware"),
        // C views of i2c-dev and libgpiod (from libi2c-dev and libgpiod-dev).
        .target(name: "CLinuxI2C", linkerSettings: [.linkedLibrary("i2c")]),
        .target(name: "CGPIOD", linkerSettings: [.linkedLibrary("gpiod")]),
        // libdbus-1 (libdbus-1-dev) and the BlueZ peripheral built on it.
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),
        .target(name: "BlueZ", dependencies: [
            "CDBus",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The Linux backends of the bus and pin protocols.
        .target(name: "LinuxHardware", dependencies: [
            "Hardware", "CLinuxI2C", "CGPIOD",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "Devices", dependencies: [
            "Hardware",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "DeviceEmulators", dependencies: ["Hardware"]),
        .target(name: "Firmware", dependencies: [
            "BLEControlProtocol", "Hardware", "Devices", "DeviceEmulators", "LinuxHardware", "BlueZ",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "SystemPackage", package: "swift-system"),
            .product(name: "Yams", package: "Yams"),
        ]),
        .executableTarget(name: "blecontrold", dependencies: [
            "Firmware",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        .executableTarget(name: "blecontrol", dependencies: [
            "BLEControlProtocol", "Firmware", "LinuxHardware", "Hardware",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // Interposes malloc to count allocations; linked into the benchmark only.
        .target(name: "CAllocationCounter"),
        .executableTarget(name: "blecontrol-bench", dependencies: [
            "BLEControlProtocol", "Firmware", "Devices", "DeviceEmulators", "Hardware", "TestSupport", "CAllocationCounter",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "BLEControlProtocolTests", dependencies: protocolTestDependencies),
        .testTarget(name: "DeviceEmulatorsTests", dependencies: ["DeviceEmulators", "Hardware"]),
        .testTarget(name: "DevicesTests", dependencies: [
            "Devices", "DeviceEmulators", "Hardware",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "FirmwareTests", dependencies: [
            "Firmware", "BLEControlProtocol", "DeviceEmulators", "Devices", "Hardware", "TestSupport",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "BlueZTests", dependencies: ["BlueZ", "CDBus"]),
        .testTarget(name: "LinuxHardwareTests", dependencies: ["LinuxHardware", "Hardware", "CLinuxI2C"]),
        .testTarget(name: "EndToEndTests", dependencies: ["BLEControlProtocol", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
