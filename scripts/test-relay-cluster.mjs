// Runs the relay's integration suite against relay nodes of a cluster (three relay nodes over a
// three-server NATS cluster on loopback, started by each test), as `npm test` runs it against the
// single-file relay (docs/cluster.md#two-modes-one-suite). The tests below are left out, each for
// the reason given: they are about something a cluster node does not have, or does differently by
// design, and the reason says where that is documented.
import { spawnSync } from 'node:child_process'

const SUITES = ['delivery', 'presence', 'address', 'auth', 'transport', 'directory', 'groups']

const FILE_ONLY = {
  // The SQLite file itself: its WAL, its schema versions.
  a_restart_loses_no_frame_and_seq_never_goes_back: 'reads the SQLite WAL file',
  a_version_2_database_gains_address_bindings_and_keeps_its_journal: 'upgrades a SQLite file',
  a_database_from_before_last_seen_is_upgraded: 'upgrades a SQLite file',
  a_version_3_database_gains_the_directory_and_keeps_its_bindings: 'upgrades a SQLite file',
  a_relay_in_memory_without_a_mailbox_keeps_a_directory_too: 'runs in memory without a mailbox',
  // A cluster node keeps a mailbox (docs/cluster.md#relay-nodes).
  without_a_mailbox_a_declared_address_is_reached_live_only: 'runs without a mailbox',
  presence_watch_v1_is_advertised_with_and_without_the_mailbox: 'runs without a mailbox',
  a_recipient_that_answers_pings_but_never_reads_is_dropped_once_its_writes_stall: 'runs without a mailbox',
  a_recipient_that_never_reads_cannot_stall_its_senders_nor_pin_memory_without_a_mailbox: 'runs without a mailbox',
  without_a_mailbox_nothing_is_journaled: 'runs without a mailbox',
  unknown_and_offline_recipients_answer_the_same_under_contacts_visibility: 'runs without a mailbox',
  without_a_mailbox_connected_members_get_the_copy_and_offline_ones_are_missed: 'runs without a mailbox',
  // Per-node memory (docs/cluster.md#what-a-node-keeps-to-itself): the test's reconnections
  // land on other nodes.
  reconnecting_does_not_refill_the_rate_bucket: "an account's rate bucket is per node",
  a_replayed_token_is_refused_past_the_account_login_limit: 'authentication limits are per node',
  a_stolen_token_cannot_keep_displacing_the_owner: 'authentication limits are per node',
  one_source_guessing_tokens_is_refused_past_its_attempt_limit: 'authentication limits are per node',
  // It checks an exchange and a group are seen at once from the other side; a node follows
  // those made through another node a moment later (cluster_relay.rs checks that it does).
  presence_is_visible_after_an_exchange_or_a_shared_group_under_contacts_visibility: 'contacts and groups are followed into each node',
  // Counted differently in JetStream (docs/cluster.md#journal): the stream's bytes include
  // JetStream's own per-message overhead, not the relay's row size.
  many_mailboxes_together_cannot_grow_the_journal_past_its_byte_cap: "the journal's byte cap is the stream's",
}

const args = ['test', '-p', 'courier-relay']
for (const suite of SUITES) args.push('--test', suite)
args.push('--')
for (const name of Object.keys(FILE_ONLY)) args.push('--skip', name)

const result = spawnSync('cargo', args, {
  stdio: 'inherit',
  env: { ...process.env, COURIER_RELAY_TEST_CLUSTER: '1' },
})
if (result.error) throw result.error
process.exit(result.status ?? 1)
