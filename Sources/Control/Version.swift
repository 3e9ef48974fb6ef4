/// The firmware's version, shown in status and `--version`.
public enum BLEControlVersion {
    public static let string = "0.2.0"
}
