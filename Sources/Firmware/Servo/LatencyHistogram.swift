/// A fixed-size latency histogram: recording never allocates, so it can sit
/// on the servo thread's hot path. Resolution is 1 µs below 1 ms, 10 µs below
/// 10 ms and 100 µs below 1 s; anything longer lands in the last bucket.
public struct LatencyHistogram: Sendable {
    private static let fine = 1000       // 0..<1 ms in 1 µs steps
    private static let medium = 900      // 1..<10 ms in 10 µs steps
    private static let coarse = 9900     // 10 ms..<1 s in 100 µs steps
    private var buckets = [Int](repeating: 0, count: fine + medium + coarse + 1)
    public private(set) var count = 0
    public private(set) var maximumMicroseconds = 0

    public init() {}

    public mutating func record(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let micros = max(0, Int(seconds) * 1_000_000 + Int(attoseconds / 1_000_000_000_000))
        buckets[Self.bucket(for: micros)] += 1
        count += 1
        maximumMicroseconds = max(maximumMicroseconds, micros)
    }

    /// The latency at quantile `q` (0…1) in microseconds (bucket's upper edge), or nil when empty.
    public func percentile(_ q: Double) -> Int? {
        guard count > 0 else { return nil }
        let target = max(1, Int((Double(count) * q).rounded(.up)))
        var seen = 0
        for (index, n) in buckets.enumerated() {
            seen += n
            if seen >= target { return min(Self.upperEdge(of: index), maximumMicroseconds) }
        }
        return maximumMicroseconds
    }

    public mutating func reset() { self = LatencyHistogram() }

    /// What status shows of it.
    public struct Summary: Sendable, Equatable {
        /// Microseconds; nil while nothing was recorded.
        public var p50: Int?
        public var p99: Int?
        public var maximum: Int?
        public init(p50: Int? = nil, p99: Int? = nil, maximum: Int? = nil) {
            self.p50 = p50
            self.p99 = p99
            self.maximum = maximum
        }
    }

    /// The median, the 99th percentile and the maximum.
    public var summary: Summary {
        Summary(p50: percentile(0.5), p99: percentile(0.99), maximum: count > 0 ? maximumMicroseconds : nil)
    }

    private static func bucket(for micros: Int) -> Int {
        if micros < 1000 { return micros }
        if micros < 10_000 { return fine + (micros - 1000) / 10 }
        if micros < 1_000_000 { return fine + medium + (micros - 10_000) / 100 }
        return fine + medium + coarse
    }

    private static func upperEdge(of index: Int) -> Int {
        if index < fine { return index + 1 }
        if index < fine + medium { return 1000 + (index - fine + 1) * 10 }
        if index < fine + medium + coarse { return 10_000 + (index - fine - medium + 1) * 100 }
        return Int.max
    }
}
