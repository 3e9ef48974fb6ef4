import BLEControlProtocol
import Board
import Foundation
import MQTT
import Reactor
import TestSupport

/// Command → output on the emulated PCA9685, through a Mosquitto broker on
/// this machine and straight over TCP, side by side in one run on one
/// in-process board: what the broker hop costs. Each sample is one
/// SERVO_VAL frame, sent when the previous one is on the chip; the clock
/// stops when the emulated chip shows the new pulse.
func benchmarkMQTT(samples: Int = 500) throws {
    guard MosquittoBroker.available else {
        print("MQTT: skipped (no \(MosquittoBroker.binary): scripts/install-deps unit installs it)")
        return
    }
    let broker = try MosquittoBroker()
    // Flush pacing off, as in the TCP latency section: the transports' own cost.
    let yaml = EmbeddedBoards.simulator
        .board(replacing: "max_flushes_per_period: 4", with: "max_flushes_per_period: 0")
        .board(replacing: "name: simulator", with: "name: bench-mqtt")
        .board(replacing: "transports:\n", with: "transports:\n" + broker.mqttSection())
    let runtime = try startBoard(yaml: yaml)
    defer { runtime.stop() }
    guard spin(until: .now + .seconds(20), { (try? runtime.status().transports.mqtt)?.hasPrefix("connected") == true }) else {
        throw BenchError("the board did not connect to the broker: \((try? runtime.status().transports.mqtt) ?? "?")")
    }
    guard let chip = runtime.emulators?.pca9685.first else { throw BenchError("no emulated PCA9685") }

    let (loop, publisher) = try operatorClient(broker, clientID: "bench-publisher")
    defer { loop.stop() }
    let tcp = try LoopbackTCPClient(port: runtime.tcpPort ?? 0)

    let paths: [(String, ([UInt8]) throws -> Void)] = [
        ("TCP (loopback)", { try tcp.send($0) }),
        ("MQTT (publish → broker → board)", { bytes in
            let sent = try loop.submitAndWait { publisher.publish("blecontrol/bench-mqtt/frames", bytes) }
            if !sent { throw BenchError("publish failed") }
        }),
    ]
    try tcp.send(FrameEncoder.encode(.enable(channel: 0, on: true)))
    // The paths take turns, frame by frame: a busy moment of the machine
    // falls on both alike.
    var latencies: [[Double]] = paths.map { _ in [] }
    for index in 0..<samples * paths.count {
        let path = index % paths.count
        let value = UInt16(index % 2 == 0 ? 100 + index % 50 * 2 : 700 + index % 50 * 2)
        let start = ContinuousClock.now
        try paths[path].1(FrameEncoder.encode(.servo(channel: 0, value: value)))
        let target = 1000 + Double(value)
        // A step of the chip is 4.9 µs at 50 Hz.
        guard spin(until: start + .seconds(10), { abs(chip.output(channel: 0).pulseWidth.value - target) < 5 }) else {
            throw BenchError("frame \(index) (\(paths[path].0)) never reached the chip")
        }
        latencies[path].append(start.duration(to: .now).inSeconds * 1e6)
    }
    _ = try? loop.submitAndWait { publisher.disconnect() }

    print("MQTT beside TCP: SERVO_VAL → pulse on the emulated PCA9685 (flush pacing off), one frame at a time, \(samples) each, same board, same run")
    print("  path                                  p50 µs    p99 µs")
    for (path, values) in zip(paths, latencies) {
        let label = path.0
        print("  " + label.padding(toLength: 36, withPad: " ", startingAt: 0)
              + String(format: "%8.0f  %8.0f", percentile(values, 0.5), percentile(values, 0.99)))
    }
}

/// The publisher: one MQTT client on its own loop, connected to `broker`
/// as its operator, as a script would be. Stop the loop when done.
func operatorClient(_ broker: MosquittoBroker, clientID: String) throws -> (EventLoop, MQTTClient) {
    let loop = try EventLoop(name: clientID)
    loop.start()
    var endpoint = MQTTEndpoint(host: "127.0.0.1", port: broker.port, clientID: clientID)
    endpoint.username = "operator"
    endpoint.password = "operator-secret"
    let connected = Promise<Int32>()
    let ready = endpoint
    let client = try loop.submitAndWait { () -> MQTTClient in
        let client = try MQTTClient(loop: loop, endpoint: ready)
        client.onConnect = { code in connected.fulfil(code) }
        try client.connect()
        return client
    }
    guard connected.wait() == 0 else {
        loop.stop()
        throw BenchError("\(clientID) was refused by the broker")
    }
    return (loop, client)
}
