//! The harness: clients with sessions and trackers, messages in flight (lost, retried,
//! duplicated, reordered), two replicas fed the same entries, and the model beside them.

use super::model::Model;
use super::*;

#[derive(Debug, Clone)]
struct InFlight {
    client: usize,
    client_id: u64,
    secret: Secret,
    seq: u64,
    op: Op,
    /// The first_incomplete it was last sent with (kept for requests of a dead session).
    first_incomplete: u64,
}

#[derive(Debug)]
struct Client {
    session: Option<(u64, Secret)>,
    tracker: RequestTracker,
}

pub(super) struct Harness {
    pub(super) a: StateMachine,
    /// Restored from its own snapshot now and then.
    pub(super) b: StateMachine,
    index: u64,
    time: u64,
    clients: Vec<Client>,
    in_flight: Vec<InFlight>,
    /// Exact copies of every tracked message sent, for network duplicates.
    sent: Vec<Tracked>,
    pub(super) model: Model,
    secrets: u128,
    pub(super) restores: usize,
    /// Subtracted from the next entry's stamp.
    lag: u64,
}

impl Harness {
    pub(super) fn new() -> Harness {
        Harness {
            a: StateMachine::new(settings()),
            b: StateMachine::new(settings()),
            index: 0,
            time: 1_000,
            clients: (0..CLIENTS)
                .map(|_| Client {
                    session: None,
                    tracker: RequestTracker::new(),
                })
                .collect(),
            in_flight: Vec::new(),
            sent: Vec::new(),
            model: Model::new(),
            secrets: 0,
            restores: 0,
            lag: 0,
        }
    }

    /// One log entry on both replicas; every response and the model checked.
    fn entry(&mut self, time: u64, commands: Vec<Command>) -> Vec<Response> {
        let time = time.saturating_sub(std::mem::take(&mut self.lag));
        self.index += 1;
        let payload = LogPayload {
            cluster_time: time,
            commands,
        };
        let got = self.a.apply(self.index, &payload);
        let got_b = self.b.apply(self.index, &payload);
        assert_eq!(
            got, got_b,
            "replicas answered differently at {}",
            self.index
        );
        for sm in [&self.a, &self.b] {
            if let Err(e) = sm.validate() {
                panic!("invariant broken at entry {}: {e}", self.index);
            }
        }
        let (a, b) = (self.a.snapshot(), self.b.snapshot());
        assert!(
            a.is_ok() && a.ok() == b.ok(),
            "replicas diverged at {}",
            self.index
        );

        self.model.begin(time);
        for (pos, (command, response)) in payload.commands.iter().zip(&got).enumerate() {
            self.model.check(self.index, pos, command, response);
        }
        self.model.check_state(&self.a);
        got
    }

    fn message(&self, f: &InFlight) -> Tracked {
        let client = &self.clients[f.client];
        let current = client.session.is_some_and(|(id, _)| id == f.client_id);
        let first_incomplete = if current {
            client.tracker.first_incomplete()
        } else {
            f.first_incomplete
        };
        Tracked::new(f.client_id, f.secret, f.seq, first_incomplete, f.op.clone())
    }

    pub(super) fn run(&mut self, action: Action) {
        let time = self.time;
        match action {
            Action::Issue { client, op } => {
                let Some((client_id, secret)) = self.clients[client].session else {
                    self.secrets += 1;
                    let secret = Secret::from_u128(self.secrets);
                    let got = self.entry(time, vec![Command::RegisterClient { secret, nonce: 0 }]);
                    if let Response::Registered { client_id, .. } = got[0] {
                        self.clients[client] = Client {
                            session: Some((client_id, secret)),
                            tracker: RequestTracker::new(),
                        };
                    }
                    return;
                };
                let tracker = &mut self.clients[client].tracker;
                let seq = tracker.next_seq();
                self.in_flight.push(InFlight {
                    client,
                    client_id,
                    secret,
                    seq,
                    op: tracked_op(&op, client_id, seq),
                    first_incomplete: tracker.first_incomplete(),
                });
            }
            Action::Deliver { picks, lose } => {
                if self.in_flight.is_empty() {
                    return;
                }
                let n = self.in_flight.len();
                let mut chosen: Vec<usize> = picks.iter().map(|p| p % n).collect();
                chosen.sort_unstable();
                chosen.dedup();
                let messages: Vec<Tracked> = chosen
                    .iter()
                    .map(|i| self.message(&self.in_flight[*i]))
                    .collect();
                for (i, m) in chosen.iter().zip(&messages) {
                    self.in_flight[*i].first_incomplete = m.first_incomplete;
                }
                self.sent.extend(messages.iter().cloned());
                let commands = messages.into_iter().map(Command::Tracked).collect();
                let got = self.entry(time, commands);
                if lose {
                    return;
                }
                // Handle replies from the back so indexes stay valid while removing.
                for (i, response) in chosen.iter().zip(got).rev() {
                    let f = &self.in_flight[*i];
                    let client = &mut self.clients[f.client];
                    let current = client.session.is_some_and(|(id, _)| id == f.client_id);
                    match response {
                        // Retried later, with the same seq.
                        Response::Op(Err(SessionError::WindowExceeded { .. })) => continue,
                        Response::Op(Err(SessionError::SessionExpired { .. })) if current => {
                            client.session = None;
                        }
                        _ if current => client.tracker.complete(f.seq),
                        _ => {}
                    }
                    self.in_flight.remove(*i);
                }
            }
            Action::Duplicate { pick } => {
                if !self.sent.is_empty() {
                    let m = self.sent[pick % self.sent.len()].clone();
                    self.entry(time, vec![Command::Tracked(m)]);
                }
            }
            Action::Forge { pick } => {
                if !self.in_flight.is_empty() {
                    let mut m = self.message(&self.in_flight[pick % self.in_flight.len()]);
                    m.secret.0[0] ^= 1;
                    self.entry(time, vec![Command::Tracked(m)]);
                }
            }
            Action::KeepAlive { client } => {
                if let Some((client_id, secret)) = self.clients[client].session {
                    self.entry(time, vec![Command::KeepAlive { client_id, secret }]);
                }
            }
            Action::Close { client } => {
                if let Some((client_id, secret)) = self.clients[client].session.take() {
                    self.entry(time, vec![Command::CloseSession { client_id, secret }]);
                }
            }
            Action::Tick { ms } => {
                self.time += ms;
                self.entry(self.time, vec![Command::Tick]);
            }
            Action::Backwards { ms } => self.lag = ms,
            Action::Untracked { op } => {
                self.entry(time, vec![Command::Untracked(untracked_op(&op))]);
            }
            Action::Configure { grow, ttl } => {
                let current = self.a.settings();
                let s = Settings {
                    window: current.window + grow,
                    session_ttl_ms: ttl,
                    ..current
                };
                self.entry(time, vec![Command::Configure(s)]);
            }
            Action::Restore => {
                let image = self.b.snapshot().expect("snapshot encodes");
                self.b = StateMachine::restore(&image).expect("own snapshot restores");
                assert_eq!(
                    self.b.snapshot().ok(),
                    Some(image),
                    "restore is not lossless"
                );
                self.restores += 1;
            }
        }
    }
}
