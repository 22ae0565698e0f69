//! The step: what a runtime does after feeding the engine its inputs, in the one order that keeps
//! the delivery promises (`docs/architecture.md#the-step`). Written once here, it is what the
//! client driver runs and what the simulator models, so the two cannot drift apart.
//!
//! 1. Apply the step's inputs ([`Step::apply`]), interleaving the runtime's own events
//!    ([`Step::emit`]), then `Input::Timeout` for whatever fell due.
//! 2. [`Host::prepare`] the step's frames for their carriers — a runtime that seals them in
//!    end-to-end sessions does it here, so that the session state sealing advances is part of
//!    the step's commit — then [`Host::commit`] every store op of the step in one transaction,
//!    with its terminal events held beside their settlements. A failed commit ends the step:
//!    nothing of it may leave.
//! 3. [`Host::resolve`]: the step is durable, so callers may be answered (a resolved send is
//!    stored) and what getters read is published — before any event of the step is seen.
//! 4. [`Host::dispatch`] the events.
//! 5. [`Host::transmit`] the frames: delivery ACKs and frame releases only now, after the
//!    commit that recorded what they acknowledge.
//! 6. [`Host::dispatch_after_transmits`]: what a durability hook verdict reported, so an app
//!    sees a committed message only once its acknowledgements are on their way.
//! 7. [`Host::offer_hook`] the next batch, whose rows are committed by now.
//! 8. [`Host::presence`]: the watchlist changes for the relay.
//!
//! Every stage may stop the step (`ControlFlow::Break`): the client stops at a failed commit,
//! the simulator crashes a device between any two stages.

use std::ops::ControlFlow;

use crate::event::Event;
use crate::input::Input;
use crate::io::{HookBatch, Millis, PresenceChange, StoreOp, Transmit};
use crate::Engine;

/// A step being built: the events of its inputs so far, in order. `E` is the runtime's event
/// type, which carries the engine's events beside its own.
#[derive(Debug)]
pub struct Step<E> {
    events: Vec<E>,
    after_transmits: Vec<E>,
}

impl<E> Default for Step<E> {
    fn default() -> Self {
        Self {
            events: Vec::new(),
            after_transmits: Vec::new(),
        }
    }
}

/// How a runtime carries out a step's outputs. Each stage may stop the step.
pub trait Host<E> {
    /// Why a step stopped early.
    type Stop;
    /// A frame as the runtime puts it on a carrier.
    type Frame;

    /// Turns the step's transmits into the frames [`Host::transmit`] will send, before the
    /// commit: what preparing them changes in the runtime's own state commits with the step.
    fn prepare(&mut self, transmits: Vec<Transmit>) -> ControlFlow<Self::Stop, Vec<Self::Frame>>;

    /// Commits `ops` in one transaction, holding the terminal events among `events` and
    /// `after_transmits` with them (they are dispatched later in this step).
    fn commit(
        &mut self,
        ops: Vec<StoreOp>,
        events: &[E],
        after_transmits: &[E],
    ) -> ControlFlow<Self::Stop>;

    /// The step is durable: answer its callers and publish what getters read (`engine`'s
    /// stats; the watchlist after `watchlist` is applied).
    fn resolve(&mut self, engine: &Engine, watchlist: &[PresenceChange])
        -> ControlFlow<Self::Stop>;

    fn dispatch(&mut self, events: Vec<E>) -> ControlFlow<Self::Stop>;

    fn transmit(&mut self, frames: Vec<Self::Frame>) -> ControlFlow<Self::Stop>;

    fn dispatch_after_transmits(&mut self, events: Vec<E>) -> ControlFlow<Self::Stop>;

    /// Hands the next batch to the durability hook.
    fn offer_hook(&mut self, batch: HookBatch) -> ControlFlow<Self::Stop>;

    /// Passes the step's watchlist changes on to the relay.
    fn presence(&mut self, changes: Vec<PresenceChange>) -> ControlFlow<Self::Stop>;
}

impl<E: From<Event>> Step<E> {
    /// Feeds `input` to the engine and takes what it reported.
    pub fn apply(&mut self, engine: &mut Engine, input: Input, now: Millis) {
        engine.handle(input, now);
        self.collect(engine);
    }

    /// A runtime event, in order with the engine's.
    pub fn emit(&mut self, engine: &mut Engine, event: E) {
        self.collect(engine);
        self.events.push(event);
    }

    /// Runs what fell due by `now`, then carries the step out through `host`, stage by stage.
    pub fn finish<H: Host<E>>(
        mut self,
        engine: &mut Engine,
        now: Millis,
        host: &mut H,
    ) -> ControlFlow<H::Stop> {
        self.apply(engine, Input::Timeout, now);
        let ops: Vec<StoreOp> = std::iter::from_fn(|| engine.poll_store()).collect();
        let frames = host.prepare(std::iter::from_fn(|| engine.poll_transmit()).collect())?;
        host.commit(ops, &self.events, &self.after_transmits)?;
        let watchlist: Vec<PresenceChange> =
            std::iter::from_fn(|| engine.poll_presence()).collect();
        host.resolve(engine, &watchlist)?;
        host.dispatch(self.events)?;
        host.transmit(frames)?;
        host.dispatch_after_transmits(self.after_transmits)?;
        if let Some(batch) = engine.poll_hook(now) {
            host.offer_hook(batch)?;
        }
        host.presence(watchlist)
    }

    fn collect(&mut self, engine: &mut Engine) {
        self.events
            .extend(std::iter::from_fn(|| engine.poll_event()).map(E::from));
        self.after_transmits
            .extend(std::iter::from_fn(|| engine.poll_event_after_transmits()).map(E::from));
    }
}
