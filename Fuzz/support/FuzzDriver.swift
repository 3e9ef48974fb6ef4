// What every fuzz target shares: starting libFuzzer's driver.
//
// SwiftPM links an executable target's entry point as `<module>_main` (so a
// test can link the module) and defines `main` as that symbol; a target
// built with -parse-as-library defines `<module>_main` itself and hands
// the process to libFuzzer from there (LLVMFuzzerRunDriver, libFuzzer's
// documented entry for programs that keep their own main).

/// The signature of `LLVMFuzzerTestOneInput`.
public typealias FuzzTarget = @convention(c) (UnsafePointer<UInt8>, Int) -> CInt

/// Runs libFuzzer with the process's arguments on `target`.
public func runFuzzer(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>, _ target: FuzzTarget) -> CInt {
    var argc = argc
    var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = argv
    return LLVMFuzzerRunDriver(&argc, &argv, target)
}

@_silgen_name("LLVMFuzzerRunDriver")
private func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ target: FuzzTarget
) -> CInt
