@testable import BlueZ
import Testing

/// The registration state machine fed events by hand: no bus, no timers.
@Suite struct RegistrationTests {
    /// An adapter with everything the board needs.
    private let adapter = Registration.Adapter(powered: true, hasGATT: true, hasAdvertising: true, alias: nil)

    /// Started, connected to the bus, bluetoothd found: its adapter not yet inspected.
    private func bluezFound() -> Registration {
        var registration = Registration(options: .init(adapter: "hci0", powerOn: true, agent: nil, alias: nil))
        _ = registration.handle(.start)
        _ = registration.handle(.busConnected)
        _ = registration.handle(.bluezAppeared(owner: ":1.7"))
        return registration
    }

    /// Brought on the air: connected, bluetoothd found, the adapter fine,
    /// the application and the advertisement registered.
    private func onTheAir() -> Registration {
        var registration = bluezFound()
        let generation = registration.generation
        #expect(registration.handle(.inspected(adapter, generation: generation)) == [
            .report("registering on hci0"), .call(.registerApplication, generation: generation)])
        #expect(registration.handle(.succeeded(.registerApplication, generation: generation)) == [
            .call(.registerAdvertisement, generation: generation)])
        #expect(registration.handle(.succeeded(.registerAdvertisement, generation: generation)) == [
            .report("advertising"), .onAir])
        return registration
    }

    @Test func aChangeOnTheAirIsRegisteredAtOnceAndIsNoNewRegistration() {
        var registration = onTheAir()
        let generation = registration.generation
        #expect(registration.handle(.readvertise) == [.call(.unregisterAdvertisement, generation: generation)])
        #expect(registration.handle(.succeeded(.unregisterAdvertisement, generation: generation)) == [
            .call(.registerAdvertisement, generation: generation)])
        #expect(registration.handle(.succeeded(.registerAdvertisement, generation: generation)) == [.onAir])
        #expect(registration.registrations == 1)
    }

    /// bluetoothd reads the properties while it handles RegisterAdvertisement:
    /// a change after the call went out (the fast period ending, a central
    /// leaving) may not be in the advertisement it answers for.
    @Test func aChangeWhileTheAdvertisementIsBeingRegisteredIsRegisteredOnceThatStands() {
        var registration = onTheAir()
        let generation = registration.generation
        _ = registration.handle(.readvertise)
        _ = registration.handle(.succeeded(.unregisterAdvertisement, generation: generation))
        // RegisterAdvertisement is out; the interval changes again.
        #expect(registration.handle(.readvertise) == [])
        #expect(registration.handle(.succeeded(.registerAdvertisement, generation: generation)) == [
            .call(.unregisterAdvertisement, generation: generation)])
        #expect(registration.isAdvertising == false)
        #expect(registration.handle(.succeeded(.unregisterAdvertisement, generation: generation)) == [
            .call(.registerAdvertisement, generation: generation)])
        #expect(registration.handle(.succeeded(.registerAdvertisement, generation: generation)) == [.onAir])
    }

    /// Before RegisterAdvertisement goes out, a change needs nothing more:
    /// bluetoothd will read the properties as they are then.
    @Test func aChangeBeforeTheAdvertisementIsRegisteredCostsNoSecondRegistration() {
        var registration = onTheAir()
        let generation = registration.generation
        _ = registration.handle(.readvertise)
        // The unregister is still out.
        #expect(registration.handle(.readvertise) == [])
        #expect(registration.handle(.succeeded(.unregisterAdvertisement, generation: generation)) == [
            .call(.registerAdvertisement, generation: generation)])
        #expect(registration.handle(.succeeded(.registerAdvertisement, generation: generation)) == [.onAir])
    }

    /// The first registration: a change while it is out, then bluetoothd
    /// answers. The board is reported on the air, and registers again.
    @Test func aChangeDuringTheFirstRegistrationIsReportedThenRegistered() {
        var registration = bluezFound()
        let generation = registration.generation
        // Not yet registering the advertisement: ignored.
        #expect(registration.handle(.readvertise) == [])
        _ = registration.handle(.inspected(adapter, generation: generation))
        _ = registration.handle(.succeeded(.registerApplication, generation: generation))
        #expect(registration.handle(.readvertise) == [])
        #expect(registration.handle(.succeeded(.registerAdvertisement, generation: generation)) == [
            .report("advertising"), .call(.unregisterAdvertisement, generation: generation)])
        #expect(registration.registrations == 1)
    }
}
