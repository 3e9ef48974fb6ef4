import BLEControlProtocol
import Board
import Control
import Foundation
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

/// What a browser page can make Chromium send to the board's TCP port: a
/// cross-site `fetch("http://127.0.0.1:7171/…", {method: "POST", mode:
/// "no-cors", body})` with the request line and headers Chromium 156 wrote
/// (captured from it on a listening socket; Tests/Web checks the real
/// browser), and a body of the page's choice: NULs that bring a decoder
/// that took the headers for frames back in step, then ANALOG_OUT_EN 0 and
/// SERVO_VAL 0 = 1000 (2000 µs).
let chromiumFetchPOST: [UInt8] = {
    let body = [UInt8](repeating: 0, count: 300) + [0x01, 0x02, 0x00, 0x01] + [0x02, 0x03, 0x00, 0x03, 0xE8]
    let head = "POST /x HTTP/1.1\r\nHost: 127.0.0.1:7171\r\nConnection: keep-alive\r\nContent-Length: \(body.count)\r\n"
        + "sec-ch-ua-platform: \"Linux\"\r\n"
        + "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/156.0.0.0 Safari/537.36\r\n"
        + "sec-ch-ua: \"Not:A-Brand\";v=\"8\", \"Chromium\";v=\"156\"\r\nsec-ch-ua-mobile: ?0\r\nAccept: */*\r\n"
        + "Origin: https://attacker.example\r\nSec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: empty\r\n"
        + "Referer: https://attacker.example/\r\nAccept-Encoding: gzip, deflate, br, zstd\r\nAccept-Language: en-US,en;q=0.9\r\n\r\n"
    return Array(head.utf8) + body
}()

/// The start of a TLS 1.3 ClientHello (RFC 8446 §4.1.2): a handshake record, 0x16 0x03 0x01.
let tlsClientHello: [UInt8] = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03] + [UInt8](repeating: 0xA5, count: 32)
    + [0x20] + [UInt8](repeating: 0x5A, count: 32) + [0x00, 0x20, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]

/// An OpenSSH client's identification string (RFC 4253 §4.2).
let sshBanner = Array("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n".utf8)

/// True once the board has closed `client`'s connection: an end of file,
/// or a reset (the board closed with bytes of ours unread).
private func closedByBoard(_ client: LoopbackTCPClient, within timeout: Duration = .seconds(20)) -> Bool {
    let deadline = ContinuousClock.now + timeout
    var scratch = [UInt8](repeating: 0, count: 4096)
    while ContinuousClock.now < deadline {
        var waiting = pollfd(fd: client.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&waiting, 1, 50) > 0 else { continue }
        let count = recv(client.fd, &scratch, scratch.count, 0)
        if count == 0 || (count < 0 && errno == ECONNRESET) { return true }
        if count < 0 && errno != EINTR && errno != EAGAIN { return false }
    }
    return false
}

@Suite("The TCP transport: only a BLEControl central gets a session", .serialized)
struct TCPTransportTests {
    private func board() throws -> RunningBoard { try RunningBoard(yaml: EmbeddedBoards.simulator) }

    /// Waits until everything the board took so far is on the chips (a
    /// control-socket send is answered only then).
    private func applied(_ board: RunningBoard) throws {
        _ = try ControlClient(path: board.socket).send(FrameEncoder.encode(.initialize))
    }

    private func tcpSessions(_ board: RunningBoard) throws -> Int {
        try board.runtime.status().sessions.filter { $0.transport == "tcp" }.count
    }

    @Test("A browser's cross-site fetch POST (Chromium's bytes, frames after NUL padding in the body) is closed, and channel 0 stays off")
    func browserFetch() throws {
        let board = try board()
        let page = try LoopbackTCPClient(port: board.port)
        try page.send(chromiumFetchPOST)
        #expect(closedByBoard(page), "the board kept the browser's connection")
        #expect(try board.runtime.status().counters.sessionsTotal == 0, "the browser was a central for a while")
        try applied(board)
        #expect(board.duty(0) == 0, "the body's frames were applied: channel 0 at \(board.pulse(0)) µs")
        #expect(try tcpSessions(board) == 0)
    }

    @Test("TLS's ClientHello, SSH's banner, an unknown command, ERROR or a known command with a wrong length first: closed, nothing applied",
          arguments: [
            ("TLS ClientHello", tlsClientHello),
            ("SSH banner", sshBanner),
            ("unknown command 09", [0x09, 0x00] + FrameEncoder.encode(.enable(channel: 0, on: true))),
            ("ERROR from a central", [0xFF, 0x01, 0x09] + FrameEncoder.encode(.enable(channel: 0, on: true))),
            ("ANALOG_OUT_EN of length 5", [0x01, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00] + FrameEncoder.encode(.enable(channel: 0, on: true))),
            ("GET, one byte a write", Array("GET / HTTP/1.1\r\n\r\n".utf8)),
          ])
    func notACentral(what: String, bytes: [UInt8]) throws {
        let board = try board()
        let peer = try LoopbackTCPClient(port: board.port)
        if what.contains("one byte a write") {
            for byte in bytes { try? peer.send([byte]) }
        } else {
            try peer.send(bytes)
        }
        #expect(closedByBoard(peer), "\(what): the board kept the connection")
        #expect(try board.runtime.status().counters.sessionsTotal == 0)
        try applied(board)
        #expect(board.duty(0) == 0)
    }

    @Test("Centrals still work: INIT first, the README's printf lines, the demo app's writes, a first frame one byte a write")
    func centrals() throws {
        let board = try board()

        let initFirst = try LoopbackTCPClient(port: board.port)
        try initFirst.send(FrameEncoder.encode(.initialize))
        try initFirst.send(FrameEncoder.encode(.enable(channel: 1, on: true)) + FrameEncoder.encode(.servo(channel: 1, value: 250)))
        #expect(eventually { abs(board.pulse(1) - 1250) < 5 })

        // README: printf '\x01\x02\x00\x01\x02\x03\x00\x01\xf4' >&3; printf '\x09\x00' >&3
        let shell = try LoopbackTCPClient(port: board.port)
        try shell.send([0x01, 0x02, 0x00, 0x01, 0x02, 0x03, 0x00, 0x01, 0xF4])
        try shell.send([0x09, 0x00])
        #expect(shell.receive(count: 3) == [0xFF, 0x01, 0x09])
        #expect(eventually { abs(board.pulse(0) - 1500) < 5 })

        // The demo app: every channel enabled, one write each, then the values.
        let app = try LoopbackTCPClient(port: board.port)
        for channel in UInt8(0)...7 { try app.send(FrameEncoder.encode(.enable(channel: channel, on: true))) }
        try app.send(FrameEncoder.encode(.servo(channel: 2, value: 700)))
        try app.send(FrameEncoder.encode(.pwm(channel: 5, value: 250)))
        #expect(eventually { abs(board.pulse(2) - 1700) < 5 && abs(board.duty(5) - 0.25) < 0.002 })

        let trickle = try LoopbackTCPClient(port: board.port)
        for byte in FrameEncoder.encode(.enable(channel: 3, on: true)) + FrameEncoder.encode(.servo(channel: 3, value: 900)) {
            try trickle.send([byte])
        }
        #expect(eventually { abs(board.pulse(3) - 1900) < 5 })
        #expect(try tcpSessions(board) == 4)
    }
}
