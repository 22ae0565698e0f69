/// <reference types="node" />
// Typings of the offline-courier public API.

// The stats are declared, and documented, with the native binding that produces them.
import type { NativeRelayStats as RelayStats, NativeStats as ProtocolStats } from '../native.js'
export type { ProtocolStats, RelayStats }

/** Stable error codes carried by every `ProtocolError`. */
export type ProtocolErrorCode =
  | 'ERR_CONFIG'
  | 'ERR_INVALID_ARGUMENT'
  | 'ERR_NOT_STARTED'
  | 'ERR_ALREADY_STARTED'
  | 'ERR_STORAGE'
  | 'ERR_UNSUPPORTED_DURABILITY_BACKEND'
  | 'ERR_EVENT_OVERFLOW'
  | 'ERR_RELAY'
  /** A group call on a device running with `encryption.enabled: false`: groups are MLS groups. */
  | 'ERR_ENCRYPTION_REQUIRED'
  /** No group with that id on this device (never joined, left, or removed). */
  | 'ERR_GROUP_NOT_FOUND'
  /** Only a group's creator adds and removes its members. */
  | 'ERR_GROUP_NOT_ADMIN'
  /** Adding members takes their key packages from the relay's directory: no relay offering one is connected. */
  | 'ERR_NOT_CONNECTED'
  /** The relay's directory holds no key package for a member to add: it must connect once first. */
  | 'ERR_KEY_PACKAGE_UNAVAILABLE'
  /** `sendMedia`: the file is larger than `media.maxFileSize`. */
  | 'ERR_FILE_TOO_LARGE'
  /** `sendMedia`: `media.maxOutgoingTransfers` transfers are unfinished already. */
  | 'ERR_MEDIA_OUTBOX_FULL'
  /** `sendMedia`: the path names no readable regular file. */
  | 'ERR_FILE_UNREADABLE'
  /** `forwardMessage`: this device keeps no received message with that id (never received, or pruned). */
  | 'ERR_MESSAGE_NOT_FOUND'
  /** `whenDelivered`: the message ended in `message_failed` (or `connection_request_undeliverable`). */
  | 'ERR_MESSAGE_FAILED'
  /** `once` or `whenDelivered`: its `signal` was aborted first. */
  | 'ERR_ABORTED'
  /** `start()`: the identity key file is a symlink, another user's or open to others, or a sealed identity was replaced by one in the clear (`docs/protocol.md#identity-key`). */
  | 'ERR_IDENTITY_REFUSED'
  | 'ERR_INTERNAL'

/**
 * Every rejection or throw of this package. A failing call changes nothing.
 *
 * @example
 * ```ts
 * try {
 *   await protocol.sendMessage(address, text)
 * } catch (e) {
 *   if (e instanceof ProtocolError && e.code === 'ERR_INVALID_ARGUMENT') showInputError(e.message)
 *   else throw e
 * }
 * ```
 */
export class ProtocolError extends Error {
  readonly name: 'ProtocolError'
  /** What went wrong, as a stable code. */
  readonly code: ProtocolErrorCode
  /**
   * What led to it: the native error the facade wrapped (with its stack), or for
   * `ERR_MESSAGE_FAILED` the failure event, or `signal.reason` for `ERR_ABORTED`.
   */
  readonly cause?: unknown
  /**
   * `ERR_MESSAGE_FAILED` only: the failure event, when it was dispatched while
   * `whenDelivered` waited (absent when the message had failed before the call).
   */
  readonly event?: MessageFailedEvent | ConnectionRequestUndeliverableEvent
  /** `options.cause`: what led to this error (ES2022 `Error` cause). */
  constructor(code: ProtocolErrorCode, message: string, options?: { cause?: unknown })
}

/** A message's priority: higher ones go first. */
export type Priority = 'low' | 'medium' | 'high' | 'critical'
/** What a message holds, as the app says (`SendOptions.contentType`). */
export type ContentType = 'text' | 'image' | 'video' | 'audio' | 'voice_note' | 'video_note' | 'file' | 'poll'
/** What `Protocol.explainMessage` answers: a sentence for a person and the facts behind it. */
export interface MessageExplanation {
  /** One short sentence, times in UTC. */
  sentence: string
  facts: MessageFacts
}

/** The structured facts of `Protocol.explainMessage`; times are epoch milliseconds. */
export interface MessageFacts {
  id: string
  direction: 'outbound' | 'inbound'
  /** The recipient, or the sender of a message received. */
  peer: string
  /**
   * `queued`, `in_flight`, `parked` (the relay said the recipient is unreachable), `custody`
   * (the relay's mailbox holds it), `awaiting_session`, `delivered`, `failed`; for a message
   * received: `buffered` (waiting for the durability hook), `received`, `expired`,
   * `undecryptable`.
   */
  state:
    | 'queued'
    | 'in_flight'
    | 'parked'
    | 'custody'
    | 'awaiting_session'
    | 'delivered'
    | 'failed'
    | 'buffered'
    | 'received'
    | 'expired'
    | 'undecryptable'
  /** When it entered `state`. */
  since: number
  firstAt: number
  lastAt: number
  /** Writes by a carrier, probes included. */
  attempts: number
  probes: number
  redrives: number
  /** ACK timeouts that scheduled a retry. */
  retries: number
  /** The carriers that wrote it (`internet` is the relay). */
  carriers: string[]
  /** The relay held it in its mailbox at some point. */
  custody: boolean
  /** The relay's unreachable cause while it is parked. */
  parkCause?: UndeliverableReasonCode
  /** What re-drove it last out of a park. */
  redrivenBy?: string
  /** The next timed send (retry or probe), while it is live. */
  nextAt?: number
  /** When the outbox lifetime ends it at the latest, while it is live. */
  expiresAt?: number
  /** Why it failed (the `message_failed` reason). */
  reason?: string
  /** The carrier the ACK came over (sent), or the message itself (received). */
  carrier?: string
  latencyMs?: number
  /** Durability hook batches that refused it, and the last reason given. */
  hookRefusals: number
  hookRefusal?: string
  /** It arrived sealed end to end. */
  encrypted: boolean
  decryptionFailures: number
  /** Entries dropped between the first and the latest kept (the ledger keeps 64 a message). */
  dropped: number
}

/** One entry of a message's ledger (`Protocol.messageTimeline`); `at` is epoch milliseconds. */
export type TimelineEntry = { seq: number; at: number } & (
  | { kind: 'accepted' }
  | { kind: 'attempt'; carrier: string; attempt: number; probe: boolean }
  | { kind: 'answer'; disposition: 'live' | 'stored' | 'unreachable'; cause?: UndeliverableReasonCode }
  | { kind: 'deferred'; reason: string; retryCount: number; nextRetryAt?: number }
  | { kind: 'parked'; cause: UndeliverableReasonCode; nextProbeAt?: number }
  | { kind: 'custody'; nextProbeAt?: number }
  | { kind: 'redriven'; trigger: string }
  | { kind: 'retrying'; ladderStep: number; nextRetryAt: number }
  | { kind: 'delivered'; carrier: string; from: string; latencyMs: number }
  | { kind: 'failed'; reason: string; retryCount: number }
  | { kind: 'buffered'; carrier: string }
  | { kind: 'hook_offered'; batch: number; origin: 'live' | 'drain' | 'redelivery' }
  | { kind: 'hook_committed'; batch: number }
  | { kind: 'hook_refused'; batch: number; reason: string }
  | { kind: 'received'; carrier: string; encrypted: boolean }
  | { kind: 'decryption_failed'; code: string; reason: string }
  | { kind: 'expired' }
)

/** A message's ledger (`Protocol.messageTimeline`). */
export interface MessageTimeline {
  id: string
  direction: 'outbound' | 'inbound'
  peer: string
  /** `delivered`, `failed`, `received`, `expired`, or `null` while it is live. */
  outcome: 'delivered' | 'failed' | 'received' | 'expired' | null
  /** Entries dropped between the first and the latest kept. */
  dropped: number
  entries: TimelineEntry[]
}

/** An OTLP/JSON attribute (`KeyValue`); 64-bit integers are strings, as OTLP/JSON spells them. */
export interface OtlpAttribute {
  key: string
  value: { stringValue: string } | { intValue: string } | { boolValue: boolean }
}

/** OpenTelemetry `TracesData` in the OTLP/JSON encoding: one resource, one scope, one span. */
export interface OtlpTraces {
  resourceSpans: Array<{
    resource: { attributes: OtlpAttribute[] }
    scopeSpans: Array<{
      scope: { name: string; version: string }
      spans: Array<{
        traceId: string
        spanId: string
        name: string
        /** 4 (producer) for a message sent, 5 (consumer) for one received. */
        kind: 4 | 5
        startTimeUnixNano: string
        endTimeUnixNano: string
        attributes: OtlpAttribute[]
        events: Array<{ timeUnixNano: string; name: string; attributes: OtlpAttribute[] }>
        /** 1 (ok) delivered or received, 2 (error) failed or expired, 0 while it is live. */
        status: { code: 0 | 1 | 2; message?: string }
      }>
    }>
  }>
}

/** Where a message stands (`Protocol.getMessageStatus`); `unknown`: this storage never had it, or forgot its outcome. */
export type MessageStatus = 'queued' | 'in_flight' | 'parked' | 'delivered' | 'failed' | 'unknown'
/** The `logLevel` threshold. `'trace'` is accepted and lets everything through, as `'debug'` does. */
export type LogLevel = 'error' | 'warn' | 'info' | 'debug' | 'trace'
/** The level of a diagnostic. */
export type DiagnosticLevel = 'error' | 'warn' | 'info' | 'debug'
/**
 * The carrier a message went or came by: `'internet'` (the relay), `'gateway'`, or the name an
 * app carrier was registered under (`Protocol.registerTransport`).
 */
export type Transport = 'internet' | 'gateway' | (string & {})

/**
 * Where a `Protocol` or a relay keeps its state: exactly one of `path` (an SQLite file, WAL
 * mode, created if missing) or `memory: true` (nothing survives `stop()`).
 */
export type StorageLocation = { path: string; memory?: never } | { memory: true; path?: never }

/**
 * The structured fields of a diagnostic handed to a {@link Logger}, as its first argument.
 */
export interface LogFields {
  /** The module that wrote it, e.g. `courier_client::carrier::relay`. */
  target: string
}

/**
 * What the `logger` option takes: pino, console, or any object with these four methods. Each
 * diagnostic is one call, fields first and the message second, as pino and bunyan take them:
 * `logger.warn({ target }, message)`. A method that throws is reported as a process warning
 * (`OfflineCourierLoggerError`) and changes nothing else.
 */
export interface Logger {
  /** Receives `debug` diagnostics. */
  debug(fields: LogFields, message: string): void
  /** Receives `info` diagnostics. */
  info(fields: LogFields, message: string): void
  /** Receives `warn` diagnostics. */
  warn(fields: LogFields, message: string): void
  /** Receives `error` diagnostics. */
  error(fields: LogFields, message: string): void
}

/** The options of `new Protocol(config)`. Unknown keys are an error (`ERR_CONFIG`). */
export interface ProtocolConfig {
  /** Namespace of this app's messages. */
  appId: string
  /** Exactly one of `path` (SQLite file, WAL) or `memory: true` (nothing survives `stop()`). */
  storage: StorageLocation & {
    /**
     * 32 bytes, kept by your app outside the database (Electron `safeStorage`, the OS keychain),
     * that seal this device's identity key at rest. Without it a file store seals the key under
     * `<path>.identity-key` (mode 0600; refused with `ERR_IDENTITY_REFUSED` if it becomes a
     * symlink, another user's or open to others) beside the database. Once given, it must be given at
     * every start: a missing or different key fails `start()` with `ERR_STORAGE` and the
     * identity is kept, never replaced.
     */
    identitySealKey?: Uint8Array
  }
  /**
   * Accept control frames signed with the legacy `offline-ctrl-v1` scheme, which proves no
   * freshness (`docs/protocol.md#control-signatures`). Default `false`: they are refused with
   * `CONTROL_SIGNATURE_STALE`.
   */
  acceptLegacyControlV1?: boolean
  /**
   * End-to-end encryption (MLS, `docs/delivery.md#sealed-messages`). On by default: every
   * message travels sealed in a session with the recipient's device, so recipients must be
   * `off1` addresses; a message waits in the pre-session queue until its session is set up
   * through the relay's key-package directory. `enabled: false` is plaintext mode: recipients may
   * be account names, every message says on the wire that it travels in the clear
   * (`encrypted: false`), and the process is warned once.
   */
  encryption?: {
    enabled?: boolean
    /**
     * What becomes of a message from a peer that is not a contact (contacts: the peers this
     * device sent a message to, and those a connection request joined it with). `'accept'`
     * (default): delivered, `knownSender: false`. `'request'`: held — not delivered, not
     * acknowledged, so the sender sends it again — and reported once as a
     * `connection_request_received` with `implicit: true`; accepting that request lets it in.
     * `'refuse'`: dropped unacknowledged.
     */
    unknownSenders?: 'accept' | 'request' | 'refuse'
  }
  /** File transfers (`docs/delivery.md#file-transfers`). */
  media?: {
    /**
     * Where received files are written (created if missing); partial files wait in its
     * `.partial` folder and never carry a final name. Default: beside the database,
     * `<storage.path>.media`.
     */
    directory?: string
    /** The largest file sent or accepted, in bytes. Default 104857600 (100 MiB). */
    maxFileSize?: number
    /** Chunk size when a relay or gateway is configured, 1024–262144. Default 262144. */
    chunkSize?: number
    /** Chunk size when only app carriers are, 1024–262144. Default 65536. */
    localChunkSize?: number
    /** Chunks of one transfer awaiting their ACK at once, 1–64. Default 8. */
    window?: number
    /** Unfinished outgoing transfers at once; beyond it `ERR_MEDIA_OUTBOX_FULL`. Default 16. */
    maxOutgoingTransfers?: number
    /** Files being received at once, from everyone. Default 16. */
    maxIncomingTransfers?: number
    /** Files being received at once from one sender. Default 4. */
    maxIncomingPerSender?: number
    /** Total size of the files being received, in bytes. Default 1073741824 (1 GiB). */
    maxIncomingBytes?: number
  }
  /** Group delivery (`docs/delivery.md#group-sends`). */
  group?: {
    /**
     * A group message goes as one relay broadcast, answered by a delivery report and backed by
     * per-member copies, when the relay advertises `group_delivery_v3` and knows the group.
     * `false`: always one copy per member. Default `true`.
     */
    relayBroadcastEnabled?: boolean
  }
  transports?: {
    internet?: {
      /**
       * Relay WebSocket URL, or a list of up to 16: the nodes of one relay cluster. The client
       * starts at one picked at random and moves to the next when a connection fails or drops
       * (`docs/protocol.md#reconnection`). `ws://` is accepted only for loopback hosts.
       */
      url: string | string[]
      /** JWT for the relay; required with `url`. */
      /**
       * The relay token: a JWT, or a function returning one (or a Promise of one), called at
       * every connect so a long-lived app never presents an expired token. A provider has 10 s
       * to answer; one that throws or returns no string gives `auth_failed` with
       * `reason: 'token_unavailable'`. A fixed token can be replaced with `setAuthToken()`.
       */
      authToken: string | (() => string | Promise<string>)
      tls?: { /** Extra trust anchors (PEM) for `wss://`, e.g. a private CA. */ caCertificates?: string }
      /** Reconnect with backoff 1 s doubling to 30 s, with jitter. Default `true`. */
      autoReconnect?: boolean
    }
    /**
     * A gateway daemon (for example a bridge to a Reticulum mesh) over plaintext TCP. Every
     * connection proves this device's address first; the carrier is available only once the
     * gateway bound that address (`gateway_status_changed` with `attached: true`). With the relay
     * up too, the relay carries each attempt and a message it parks is also offered through the
     * gateway. Reconnects with backoff 1 s doubling to 30 s, with jitter.
     */
    gateway?: {
      /** `host:port` of the daemon. Default `'localhost:4242'`. A host other than loopback is accepted with a warning. */
      address?: string
      /**
       * The attach token of a gateway started with `--require-token-file` (or `requireToken`),
       * sent in every `Identify`. A gateway that refuses it raises `security_warning`
       * `GATEWAY_ADDRESS_DECLARATION_REFUSED`. The link is plaintext: the token is readable by
       * anyone on the path to a non-loopback gateway.
       */
      token?: string
    }
  }
  reliability?: {
    ack?: {
      /** ACK timeout from the moment the frame is written to a carrier. Default 10000. */
      defaultTimeoutMs?: number
      /** In-flight cap; beyond it sends wait (never dropped). Default 1000. */
      maxPendingAcks?: number
    }
    retry?: {
      /** ACK-retry budget before `message_failed`. Default 10. */
      maxRetries?: number
      /** First backoff delay. Default 1000. */
      initialDelayMs?: number
      /** Backoff ceiling. Default 300000. */
      maxDelayMs?: number
      /** Finite, >= 1. Default 2. */
      backoffMultiplier?: number
      /** Sliding outbox lifetime; the absolute cap is 4x. Default 604800000 (7 days). */
      outboxMaxLifetimeMs?: number
      /**
       * How long a message may wait for its end-to-end session, from its first queueing.
       * Default 604800000 (7 days); past it, `message_failed` ('Pending session lifetime exceeded').
       */
      pendingMessageMaxLifetimeMs?: number
    }
    /** Bounded timed probes for unreachable recipients, then edge-driven only. Default `false`. */
    edgeDrivenUnreachableDm?: boolean
  }
  /**
   * Opt-in at-least-once inbound delivery: nothing is acknowledged to the relay or the sender
   * until this hook's Promise resolves for the batch holding the message. A throw, a rejection,
   * a return value that is not a Promise, or a timeout is a failure: the batch is offered again.
   * Make it idempotent by `(chat, sender, messageId)`. Needs `storage.path`.
   */
  inboundDurabilityHook?: (batch: InboundMessage[]) => Promise<void>
  /** Timeout of the inbound durability hook. Default 30000. */
  inboundDurabilityHookTimeoutMs?: number
  /**
   * Level of diagnostics forwarded as `diagnostic` events (and to `logger`); those below it are
   * never produced. Default `'warn'`.
   */
  logLevel?: LogLevel
  /**
   * The app's logger (pino, console, …): each diagnostic at or above `logLevel` goes to it as
   * `logger[level]({ target }, message)`. With a logger, `diagnostic` events still reach
   * `onEvent`, `on('diagnostic')` and `once('diagnostic')` listeners, but no longer the
   * `events()` iterators, whose bounded buffers a verbose level could otherwise overflow.
   */
  logger?: Logger
}

/** An excerpt a message quotes (`SendOptions.quote`, and on a received message). */
export interface Quote {
  /** The quoted text. */
  text: string
  /** Who wrote it. */
  sender?: string
  /**
   * The quoted message's id: sending, one this device received (its `messageId`) or sent (its
   * own id); received, the id the quoted message arrived under.
   */
  messageId?: string
}

/** Where a forwarded message first came from (`forwardMessage`). */
export interface ForwardInfo {
  /** The original message's id, as its first recipient saw it (`messageId`). */
  messageId: string
  /** The original message's sender. */
  sender: string
  /** The original sender's clock when it sent the message (epoch ms). */
  timestamp: number
  /** Where it was first received: its sender for a direct message, the group for a group message. */
  chat?: string
  /** How many forwards brought it here: 1 for a forward of the original. */
  forwardCount: number
}

/**
 * What a received message carries beside its content (`docs/protocol.md#rich-messages`). A part a
 * peer sent malformed arrives as absent (`null`, or no mentions), with a `warn` diagnostic.
 */
export interface RichMessageFields {
  /** The id of the message this one replies to, as this device saw it (`messageId`); `null` when none. */
  replyTo: string | null
  quote: Quote | null
  /** Empty when none. */
  mentions: string[]
  /** The sender app's data. */
  extras: Record<string, unknown> | null
  /** Set on a forwarded message. */
  forwardInfo: ForwardInfo | null
}

/** One message handed to the inbound durability hook. */
export interface InboundMessage extends RichMessageFields {
  chat: string
  sender: string
  messageId: string
  content: string | Uint8Array
  contentType: ContentType
  timestamp: number
  metadata: Record<string, string>
  /** `'live'` (a batch of one), `'drain'` (the offline backlog), `'redelivery'` (offered again). */
  origin: 'live' | 'drain' | 'redelivery'
  /** The group of a group message (then `chat` is the group too); absent for a direct message. */
  groupId?: string
}

/** The options of `Protocol.sendMessage`. */
export interface SendOptions {
  /** Default `'medium'`. */
  priority?: Priority
  /** Client-chosen id: sending an id already in the outbox or already delivered is a no-op returning it. */
  id?: string
  /** Default `'text'`. */
  contentType?: ContentType
  /** App metadata (string values; reserved keys are refused). */
  metadata?: Record<string, string>
  /** The id of the message this one replies to: a received `messageId`, or an id this device sent. */
  replyTo?: string
  /** An excerpt this message quotes. */
  quote?: Quote
  /** Identifiers (addresses, account names) this message mentions: at most 256, each once. */
  mentions?: string[]
  /**
   * The app's own data: a plain JSON object. `quote`, `mentions` and `extras` together are at most
   * 32 KiB serialized, and count toward the 256 KiB of a direct message.
   */
  extras?: Record<string, unknown>
}

/** The options of `Protocol.forwardMessage`. */
export interface ForwardOptions {
  /** Default `'medium'`. */
  priority?: Priority
  /** Client-chosen id of the forward, as `SendOptions.id`. */
  id?: string
}

/** A carrier wrote the message; `attempt` counts the ACK ladder's attempts from 1. */
export interface MessageSentEvent { type: 'message_sent'; messageId: string; recipient: string; priority: Priority; transport: Transport; attempt: number }
/**
 * Why a message waits for a carrier: one of the engine's fixed reasons, or a carrier's own words
 * (an app carrier's rejection message, a sealing error).
 */
export type MessageDeferredReason =
  | 'no carrier available'
  | 'in-flight limit reached'
  | 'carrier unavailable'
  | 'neighbor lost'
  | 'app carrier send timed out'
  | 'awaiting end-to-end session'
  | 'no end-to-end session with the recipient'
  | 'relay not connected'
  | 'relay connection lost'
  | 'gateway not attached'
  | (string & {})
/** No carrier can take the message now: it waits, and goes the moment one is up. */
export interface MessageDeferredEvent { type: 'message_deferred'; messageId: string; recipient: string; reason: MessageDeferredReason; retryCount: number; /** `null` when no timer is set (waiting for a carrier). */ nextRetryAt: number | null }
/** The relay took custody (its mailbox holds the message). Not delivery; never becomes a failure by timeout. */
export interface MessageStoredEvent { type: 'message_stored'; messageId: string; recipient: string }
/** No ACK in time: the next attempt is at `nextRetryAt`. */
export interface MessageRetryingEvent { type: 'message_retrying'; messageId: string; recipient: string; retryCount: number; nextRetryAt: number }
/**
 * Terminal: the recipient acknowledged the message. `replayed: true` marks a terminal event
 * emitted again at `start()` because the process ended after committing it and before recording
 * that the listeners had run for it: key your handling by `messageId`.
 */
export interface MessageDeliveredEvent { type: 'message_delivered'; messageId: string; recipient: string; latencyMs: number; hopCount: number; transport: Transport; replayed?: true }
/** Why a message failed (`docs/delivery.md#exactly-one-terminal-event`). */
export type MessageFailedReason =
  | 'Max retries exceeded'
  | 'Outbox lifetime exceeded'
  | 'Outbox capacity exceeded'
  | 'Pending session lifetime exceeded'
  | 'Pending session queue capacity exceeded'
  | 'Control signature expired'
/** Terminal failure. `replayed: true`: see {@link MessageDeliveredEvent}. */
export interface MessageFailedEvent { type: 'message_failed'; messageId: string; recipient: string; reason: MessageFailedReason; retryCount: number; replayed?: true }
/** An inbound message. */
export interface MessageReceivedEvent extends RichMessageFields {
  type: 'message_received'
  messageId: string
  sender: string
  recipient: string
  chat: string
  /** A string, or a `Uint8Array` when the sender sent bytes. */
  content: string | Uint8Array
  contentType: ContentType
  timestamp: number
  transport: Transport
  hopCount: number
  metadata: Record<string, string>
  /** It arrived sealed in an end-to-end session, and `sender` is that session's credential. */
  encrypted: boolean
  /** The sender is one of this device's contacts (see `encryption.unknownSenders`). */
  knownSender: boolean
  /** The group the message was sent to (then `chat` is the group too); absent for a direct message. */
  groupId?: string
}
/**
 * A peer asks to connect. Answer with `acceptConnection(requestId)` or
 * `rejectConnection(requestId)`; `connectionRequests()` lists what waits, across restarts.
 * `implicit`: the peer did not ask but sent a message while `encryption.unknownSenders` is
 * `'request'` (the request's id is that message's).
 */
export interface ConnectionRequestReceivedEvent {
  type: 'connection_request_received'
  requestId: string
  sender: string
  message: string | null
  implicit: boolean
}
/** The peer accepted this device's request; with encryption the session is set up both ways. */
export interface ConnectionAcceptedEvent { type: 'connection_accepted'; requestId: string; peer: string }
/** The peer declined this device's request. */
export interface ConnectionRejectedEvent { type: 'connection_rejected'; requestId: string; peer: string }
/** The requester withdrew its request before this device answered. */
export interface ConnectionRequestCancelledEvent { type: 'connection_request_cancelled'; requestId: string; sender: string }
/**
 * Terminal, in place of `message_failed`: the relay cannot reach the peer now, and a connection
 * request is never parked. `replayed: true`: see {@link MessageDeliveredEvent}.
 */
export interface ConnectionRequestUndeliverableEvent { type: 'connection_request_undeliverable'; requestId: string; recipient: string; replayed?: true }
/** A connection request waiting for an answer. */
export interface ConnectionRequest {
  requestId: string
  peer: string
  /** Made to this device (it waits for your answer); else made by it. */
  incoming: boolean
  message: string | null
  /** When this device sent or received it (epoch ms). */
  at: number
}
/**
 * Why a sealed message did not open: `NO_SESSION` (no session with the sender), `NOT_BOUND` (the
 * session's credential is not the sender's address), `MALFORMED`, `REFUSED` (MLS refused it, or
 * its key is spent: a replay), `ENCRYPTION_DISABLED` (this device runs with `encryption.enabled: false`).
 */
export type DecryptionFailureCode = 'NO_SESSION' | 'NOT_BOUND' | 'MALFORMED' | 'REFUSED' | 'ENCRYPTION_DISABLED'
/**
 * A sealed message did not open on this attempt. Advisory, per attempt: it was not acknowledged,
 * and the sender's retry, sealed again, is what recovers it.
 */
export interface MessageDecryptionFailedEvent {
  type: 'message_decryption_failed'
  messageId: string
  sender: string
  code: DecryptionFailureCode
  reason: string
}
/** Why the relay or gateway said the recipient cannot be reached; `unspecified` when its verdict named no known cause. */
export type UndeliverableReasonCode = 'unknown_recipient' | 'offline_no_mailbox' | 'mailbox_full' | 'unspecified'
/**
 * The relay says the recipient cannot be reached now: the message is parked (not failed) and
 * re-driven on reachability edges and probes. Non-terminal; may repeat. `reasonCode` is the
 * cause as a stable code; `reason` is text for people.
 */
export interface MessageUndeliverableEvent {
  type: 'message_undeliverable'
  messageId: string
  recipient: string
  reasonCode: UndeliverableReasonCode
  reason: string
  fileId?: string
}
/** A watched peer came online or went offline (`lastSeenMs` when the relay knows it). */
export interface PresenceUpdatedEvent { type: 'presence_updated'; peerId: string; online: boolean; lastSeenMs?: number }
/** An app carrier reported `peerId` in reach (`Protocol.neighborDiscovered`). */
export interface NeighborDiscoveredEvent { type: 'neighbor_discovered'; peerId: string; transport: string }
/** An app carrier reported `peerId` out of reach (`Protocol.neighborLost`). */
export interface NeighborLostEvent { type: 'neighbor_lost'; peerId: string; transport: string }
/** What a `security_warning` is about (`docs/protocol.md#security-warnings` says when each occurs). */
export type SecurityWarningReasonCode =
  | 'UNSIGNED_CONTROL_REJECTED'
  | 'CONTROL_SIGNATURE_INVALID'
  | 'SENDER_ADDRESS_MISMATCH'
  | 'CONTROL_SIGNATURE_STALE'
  | 'TRANSPORT_IDENTITY_MISMATCH'
  | 'RELAY_ADDRESS_BINDING_MISMATCH'
  | 'RELAY_ADDRESS_DECLARATION_REFUSED'
  /** Another connection logged in with this device's account token and the relay displaced this one. */
  | 'RELAY_SESSION_SUPERSEDED'
  | 'GATEWAY_ADDRESS_BINDING_MISMATCH'
  | 'GATEWAY_ADDRESS_DECLARATION_REFUSED'
  /** A buffered message the durability hook never committed within 7 days was removed. */
  | 'INBOUND_RETENTION_EXPIRED'
/** Something that deserves attention on security or data-retention grounds; `reason` is fixed local text. */
export interface SecurityWarningEvent { type: 'security_warning'; peerId: string; reasonCode: SecurityWarningReasonCode; reason: string }
/** First event of every start: the address this device sends as (its identity key is persisted in storage). */
export interface IdentityReadyEvent { type: 'identity_ready'; address: string }
/** The relay connection came up (`authenticated` once the relay took the token) or went down. */
export interface InternetStatusChangedEvent { type: 'internet_status_changed'; connected: boolean; authenticated: boolean }
/**
 * The gateway carrier: `connected` once the TCP connection is up, `attached` once the gateway
 * bound this device's own address (only then does anything go over it). A refused or mismatched
 * binding is a `security_warning` (`GATEWAY_ADDRESS_DECLARATION_REFUSED`,
 * `GATEWAY_ADDRESS_BINDING_MISMATCH`) and the connection closes.
 */
export interface GatewayStatusChangedEvent { type: 'gateway_status_changed'; connected: boolean; attached: boolean }
/** Another connection of this account took over this device's relay session. */
export interface InternetSessionSupersededEvent { type: 'internet_session_superseded'; reason: string }
/** Why a relay connection was not authenticated: the relay's `AuthError` reasons, `rejected` for a bare close 4001, `token_unavailable` when the provider gave no token. */
export type AuthFailureReason =
  | 'token_expired'
  | 'invalid_token'
  | 'token_not_yet_valid'
  | 'invalid_account'
  | 'not_authenticated'
  | 'auth_timeout'
  | 'rejected'
  | 'token_unavailable'
/**
 * The relay refused this connection's token, or the token provider gave none (`message` says
 * why). The carrier tries again in `retryInMs`: 30 s for a fixed token (sooner if
 * `setAuthToken()` brings a new one), the reconnect backoff for a provider.
 */
export interface AuthFailedEvent { type: 'auth_failed'; reason: AuthFailureReason; message: string | null; retryInMs: number }
/** A relay frame the engine does not consume, verbatim. */
export interface InternetServerMessageEvent { type: 'internet_server_message'; json: string }
/** The relay's offline backlog has been processed: `count` frames since connect. */
export interface InboundDrainCompletedEvent { type: 'inbound_drain_completed'; count: number }
/** A log line at or above `logLevel`; `target` is the module that wrote it. */
export interface DiagnosticEvent { type: 'diagnostic'; level: DiagnosticLevel; message: string; target: string }

/**
 * This device created a group (`createGroup`), or was added to one and joined it by its Welcome.
 * `admin` is the creator, the only member that adds and removes; `members` include this device.
 */
export interface GroupCreatedEvent { type: 'group_created'; groupId: string; name: string; admin: string; members: string[] }
/** `member` joined the group; later group messages reach it, earlier ones never do. */
export interface GroupMemberAddedEvent { type: 'group_member_added'; groupId: string; member: string; addedBy: string }
/**
 * `member` left (`removedBy` is itself) or was removed. When `member` is this device the group
 * is gone from it: it reads nothing sealed afterwards.
 */
export interface GroupMemberRemovedEvent { type: 'group_member_removed'; groupId: string; member: string; removedBy: string }
/**
 * A group message was accepted and went on its way: `'relay'`, one broadcast awaiting the
 * relay's report; `'fanout'`, one copy per member, each with the whole delivery ladder.
 */
export interface GroupMessageSentEvent { type: 'group_message_sent'; groupId: string; messageId: string; path: 'relay' | 'fanout'; members: number }
/**
 * The relay's report on a broadcast, after its backstop: `delivered` members took it live,
 * `pushed` members' mailboxes hold it, and `missedReissued` got a per-member copy (missed, or
 * unknown to the relay). Observability only: the copies are already on their way.
 */
export interface GroupMessageDeliveryReportEvent {
  type: 'group_message_delivery_report'
  groupId: string
  messageId: string
  delivered: string[]
  pushed: string[]
  missedReissued: string[]
}
/** Where one member of a group message stands (`getGroupMessageStatus`). */
export type GroupMemberStatus = 'pending' | 'stored' | 'delivered' | 'failed'
/** One member's state of a group message changed; `delivered` and `failed` are final. */
export interface GroupMessageMemberStatusEvent { type: 'group_message_member_status'; groupId: string; messageId: string; member: string; status: GroupMemberStatus }
/** The relay is ready (or no longer) to broadcast this device's messages to the group. */
export interface GroupRelaySyncChangedEvent { type: 'group_relay_sync_changed'; groupId: string; synced: boolean }
/** A group this device is in (`listGroups`). */
export interface GroupInfo {
  groupId: string
  name: string
  /** The creator: the only member that adds and removes. */
  admin: string
  /** This device included, sorted. */
  members: string[]
  /** The relay broadcasts to it on the current connection. */
  relaySynced: boolean
}
/** Each member's state of a group message, kept after delivery (`getGroupMessageStatus`). */
export interface GroupMessageStatus {
  groupId: string
  members: Record<string, GroupMemberStatus>
}

/** Which way a file goes. */
export type FileDirection = 'outgoing' | 'incoming'
/**
 * A file transfer moved: `bytes` of `totalBytes` acknowledged by the receiver (outgoing) or
 * written here (incoming). At most four a second per transfer, and always the last; never going
 * back, except when a transfer starts over (the receiver's checksum failed, the file changed).
 */
export interface FileProgressEvent {
  type: 'file_progress'
  fileId: string
  direction: FileDirection
  /** The recipient (outgoing) or the sender (incoming). */
  peer: string
  bytes: number
  totalBytes: number
  chunks: number
  totalChunks: number
  /** Since this process started following the transfer. */
  bytesPerSecond: number
  /** `null` until there is a rate to go by. */
  etaMs: number | null
}
/** A whole file arrived, its SHA-256 checked, under its final name in `media.directory`. */
export interface FileReceivedEvent {
  type: 'file_received'
  fileId: string
  sender: string
  path: string
  fileName: string | null
  /** The MIME type the sender gave. */
  contentType: string | null
  size: number
  sha256: string
  caption: string | null
  metadata: Record<string, string>
  /** The message this file answers (as this device knows its id). */
  replyTo: string | null
  /** Where a forwarded file came from. */
  forwardInfo: ForwardInfo | null
}
/** Every chunk of an outgoing file was acknowledged: the recipient holds it whole. Terminal. */
export interface FileDeliveredEvent { type: 'file_delivered'; fileId: string; recipient: string; size: number }
/** A transfer ended without the file: terminal for an outgoing one. */
export interface FileFailedEvent { type: 'file_failed'; fileId: string; direction: FileDirection; peer: string; reason: string }
/**
 * At `start()`: a transfer sent from bytes lost them with the last process. Call `sendMedia`
 * with the same `fileId` and bytes; only what the recipient lacks is sent again.
 */
export interface MediaResendRequiredEvent { type: 'media_resend_required'; fileId: string; recipient: string; fileName: string | null; fileSize: number }

/** The options of `sendMedia`. */
export interface SendMediaOptions {
  /** Your id for the transfer: answering `media_resend_required`, or making a repeat a no-op. */
  fileId?: string
  /** Shown to the receiver; a path source's own name by default. */
  fileName?: string
  /** The MIME type, e.g. `'image/jpeg'`. */
  contentType?: string
  caption?: string
  /** The id of the message this file answers. */
  replyTo?: string
  metadata?: Record<string, string>
}

/** Every event, discriminated on `type`. */
export type ProtocolEvent =
  | MessageSentEvent
  | MessageDeferredEvent
  | MessageStoredEvent
  | MessageRetryingEvent
  | MessageDeliveredEvent
  | MessageFailedEvent
  | MessageReceivedEvent
  | MessageDecryptionFailedEvent
  | MessageUndeliverableEvent
  | ConnectionRequestReceivedEvent
  | ConnectionAcceptedEvent
  | ConnectionRejectedEvent
  | ConnectionRequestCancelledEvent
  | ConnectionRequestUndeliverableEvent
  | PresenceUpdatedEvent
  | NeighborDiscoveredEvent
  | NeighborLostEvent
  | SecurityWarningEvent
  | IdentityReadyEvent
  | InternetStatusChangedEvent
  | GatewayStatusChangedEvent
  | InternetSessionSupersededEvent
  | AuthFailedEvent
  | InternetServerMessageEvent
  | InboundDrainCompletedEvent
  | DiagnosticEvent
  | GroupCreatedEvent
  | GroupMemberAddedEvent
  | GroupMemberRemovedEvent
  | GroupMessageSentEvent
  | GroupMessageDeliveryReportEvent
  | GroupMessageMemberStatusEvent
  | GroupRelaySyncChangedEvent
  | FileProgressEvent
  | FileReceivedEvent
  | FileDeliveredEvent
  | FileFailedEvent
  | MediaResendRequiredEvent

/** The `type` of every event. */
export type ProtocolEventType = ProtocolEvent['type']
/** The event whose `type` is `K`, e.g. `ProtocolEventOf<'message_delivered'>`. */
export type ProtocolEventOf<K extends ProtocolEventType> = Extract<ProtocolEvent, { type: K }>

/** The options of a wait (`Protocol.once`, `Protocol.whenDelivered`). */
export interface WaitOptions {
  /** Aborting it rejects the wait with `ERR_ABORTED` (`cause`: the signal's reason). */
  signal?: AbortSignal
}

/** An app-supplied local carrier (BLE, Wi-Fi Direct, a socket…). */
export interface LocalTransport {
  /**
   * Hands `frame` (an encoded message) to `peerId`. Resolve once it is written; reject when it
   * could not be. A send that settles neither way within 15 s counts as failed.
   */
  send(peerId: string, frame: Uint8Array): Promise<void>
}

/**
 * One device: its storage, outbox and carriers.
 *
 * @example
 * ```ts
 * await using protocol = new Protocol({ appId: 'chat', storage: { path: 'chat.db' }, logger: pino() })
 * protocol.on('message_received', (ev) => show(ev.sender, ev.content))
 * await protocol.start()
 * const id = await protocol.sendMessage(address, 'hello')
 * await protocol.whenDelivered(id, { signal: AbortSignal.timeout(60_000) })
 * ```
 */
export class Protocol {
  /** Validates the whole config synchronously; throws `ProtocolError` `ERR_CONFIG` naming the path. */
  constructor(config: ProtocolConfig)
  /** Opens storage (one `Protocol` per file, across processes), restores the outbox, connects. */
  start(): Promise<void>
  /**
   * Stops timers and carriers and flushes storage; the process can exit afterwards. Restartable.
   * Ends the `events()` iterators and rejects pending `once` and `whenDelivered` waits with
   * `ERR_NOT_STARTED`. Stopping a stopped protocol does nothing.
   */
  stop(): Promise<void>
  /** `stop()`, so that `await using protocol = new Protocol(…)` stops it at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void>
  /** Resolves with the message id once the message is durably in the outbox. */
  sendMessage(recipient: string, content: string | Uint8Array, options?: SendOptions): Promise<string>
  /**
   * Forwards a message this device received, by the `messageId` it saw, to `to`: an address, or
   * a group this device is in. The forward carries the message's content, content type, metadata,
   * quote, mentions and extras, and `forwardInfo` naming where it first came from (a forward of a
   * forward keeps that origin and counts one more). Resolves with the forward's id once it is
   * durably accepted; `ERR_MESSAGE_NOT_FOUND` when this device keeps no received message with that
   * id (it keeps the latest 10 000, up to 64 MiB).
   */
  forwardMessage(messageId: string, to: string, options?: ForwardOptions): Promise<string>
  /**
   * Asks the device `peer` (an `off1` address) to connect; resolves with the request's id once
   * it is durably in the outbox. It settles as `message_delivered` when it reached the device, or
   * at once as `connection_request_undeliverable` when the relay cannot reach it. A request to
   * the same peer still waiting resolves with that request's id.
   */
  sendConnectionRequest(peer: string, options?: { message?: string }): Promise<string>
  /** Accepts request `requestId` made to this device. `ERR_INVALID_ARGUMENT` when none waits. */
  acceptConnection(requestId: string): Promise<void>
  /** Declines request `requestId` made to this device. `ERR_INVALID_ARGUMENT` when none waits. */
  rejectConnection(requestId: string): Promise<void>
  /** Withdraws this device's own request `requestId`. */
  cancelConnectionRequest(requestId: string): Promise<void>
  /** The connection requests waiting for an answer, this device's and others', oldest first. */
  connectionRequests(): Promise<ConnectionRequest[]>
  /** Answered from storage; survives restarts. */
  getMessageStatus(id: string): Promise<MessageStatus>
  /**
   * Explains message `id` from its ledger (`docs/delivery.md#a-messages-life`): a short sentence
   * ("parked since 10:03: the relay says bob has no mailbox; 3 attempts over the relay; next
   * probe 10:18; will fail at the outbox lifetime on Dec 8", times in UTC) and the facts behind
   * it, for any message the ledger still holds, delivered and failed ones included. Rejects with
   * `ERR_MESSAGE_NOT_FOUND` when it holds none.
   */
  explainMessage(id: string): Promise<MessageExplanation>
  /**
   * Message `id`'s ledger: every attempt, answer, park, probe, re-drive, retry and outcome (for
   * a message received: buffering, hook batches, decryption), oldest first. Rejects with
   * `ERR_MESSAGE_NOT_FOUND` when the ledger holds none.
   */
  messageTimeline(id: string, options?: { format?: 'json' }): Promise<MessageTimeline>
  /**
   * The ledger as OpenTelemetry trace data in the OTLP/JSON encoding: one span for the message,
   * each entry a span event, for the app's own exporter. Nothing is sent anywhere.
   */
  messageTimeline(id: string, options: { format: 'otlp' }): Promise<OtlpTraces>
  /**
   * Creates an end-to-end encrypted group with this device as its admin and `members` (`off1`
   * addresses, this device not among them); resolves with the group's id once every member is
   * in it, durably. Each member's key package comes from the relay's directory:
   * `ERR_NOT_CONNECTED` without a relay offering it, `ERR_KEY_PACKAGE_UNAVAILABLE` for a member
   * that has none there (nothing is created then).
   */
  createGroup(name: string, members: string[]): Promise<string>
  /** Adds `member` (admin only); it reads what is sent from now on, never what came before. */
  addGroupMember(groupId: string, member: string): Promise<void>
  /** Removes `member` (admin only); it cannot read anything sent afterwards. */
  removeGroupMember(groupId: string, member: string): Promise<void>
  /** Leaves the group (the admin removes the others instead); this device reads nothing of it afterwards. */
  leaveGroup(groupId: string): Promise<void>
  /**
   * Sends to every member of the group; resolves with the message's one id once it is durably
   * accepted. Not held to the 256 KiB cap of `sendMessage`: the sealed message must fit one
   * relay frame (1 MiB). Each member's progress: `group_message_member_status`,
   * `getGroupMessageStatus`.
   */
  sendGroupMessage(groupId: string, content: string | Uint8Array, options?: SendOptions): Promise<string>
  /**
   * Sends a file: `source` is a path (streamed from disk, never held whole in memory; resumed on
   * its own after a restart) or the bytes (`media_resend_required` after a restart). Resolves
   * with the file id once the transfer is durably accepted; `file_progress`, then
   * `file_delivered` or `file_failed`, follow. `ERR_FILE_TOO_LARGE` over `media.maxFileSize`,
   * `ERR_MEDIA_OUTBOX_FULL` at `media.maxOutgoingTransfers`, `ERR_FILE_UNREADABLE` for a path
   * that is not a readable file.
   */
  sendMedia(recipient: string, source: string | Uint8Array, options?: SendMediaOptions): Promise<string>
  /** Each member's state of group message `id`, from storage (also after delivery); `null` when unknown. */
  getGroupMessageStatus(id: string): Promise<GroupMessageStatus | null>
  /** The groups this device is in. */
  listGroups(): Promise<GroupInfo[]>
  /**
   * Waits for message `id` (a `sendMessage` or `sendConnectionRequest` id) to settle. Resolves
   * with its `message_delivered` event, or with `null` when it had been delivered before this
   * call (storage keeps the outcome, not the event). Rejects with `ERR_MESSAGE_FAILED` when it
   * fails (`message_failed`, or `connection_request_undeliverable` for a connection request),
   * the failure event as `event` and `cause` when this wait saw it; with `ERR_INVALID_ARGUMENT`
   * when this storage does not know `id`; with `ERR_ABORTED` on `signal`; with
   * `ERR_NOT_STARTED` before `start()` or on `stop()`. Nothing is held for `id` once it settled.
   */
  whenDelivered(id: string, options?: WaitOptions): Promise<MessageDeliveredEvent | null>
  /** Counts of what the engine holds right now. Throws `ERR_NOT_STARTED` before `start()`. */
  stats(): ProtocolStats
  /**
   * OS hint: `true` reconnects now and flushes; `false` closes the relay connection, which is
   * dialled again after 60 s unless a `true` or `reconnect()` comes first.
   */
  internetStatusChanged(online: boolean): void
  /**
   * Drops the relay connection, if one is up, and dials again at once: call it when the OS
   * resumes from sleep (Electron `powerMonitor` `resume`), when a socket may be dead without
   * anyone knowing yet.
   */
  reconnect(): void
  /**
   * Replaces the fixed relay token for the next connect, and ends the 30 s wait after a refused
   * one. `ERR_INVALID_ARGUMENT` when no relay is configured or `authToken` is a provider.
   */
  setAuthToken(token: string): void
  /**
   * Registers a local carrier under `name` (not `'internet'` or `'gateway'`); it reaches the peers
   * reported as neighbors. Works before `start()`, and a registration survives `stop()` and `start()`.
   */
  registerTransport(name: string, transport: LocalTransport): void
  /** A reachability edge: `peerId` is in reach on `transport`; its queued and parked messages go now. */
  neighborDiscovered(peerId: string, transport: string): void
  /** `peerId` went out of reach on `transport`. */
  neighborLost(peerId: string, transport: string): void
  /** Bytes that arrived from `peerId` on `transport`. Invalid frames are dropped with a `diagnostic`. */
  receiveFrame(transport: string, peerId: string, frame: Uint8Array | string): void
  /** This device's `off1…` address, derived from its persisted identity key. Throws `ERR_NOT_STARTED` before `start()`. */
  localAddress(): string
  /** Recipients of pending and parked messages, whose presence the engine watches itself. */
  internetPresenceWatchlist(): string[]
  /**
   * Adds a listener for every event. Listeners run on the JS thread in event order, in the order
   * they were added (with those of `on`); one that throws is reported as a process warning
   * (`OfflineCourierListenerError`) and the others still run. Returns the unsubscribe function.
   */
  onEvent(listener: (event: ProtocolEvent) => void): () => void
  /**
   * Adds a listener for the events of one `type`, which it receives narrowed to that type. Runs
   * like an `onEvent` listener. Returns the unsubscribe function. An unknown `type` throws
   * `ERR_INVALID_ARGUMENT`.
   *
   * @example
   * ```ts
   * const off = protocol.on('message_delivered', (ev) => console.log(ev.messageId, ev.latencyMs))
   * ```
   */
  on<K extends ProtocolEventType>(type: K, listener: (event: ProtocolEventOf<K>) => void): () => void
  /**
   * The next event of `type`. Rejects with `ERR_ABORTED` on `signal`, with `ERR_NOT_STARTED` on
   * `stop()`, with `ERR_INVALID_ARGUMENT` for an unknown `type`.
   *
   * @example
   * ```ts
   * const ready = protocol.once('identity_ready')
   * await protocol.start()
   * console.log((await ready).address)
   * ```
   */
  once<K extends ProtocolEventType>(type: K, options?: WaitOptions): Promise<ProtocolEventOf<K>>
  /**
   * Events as an async iterator. Bounded buffer (default 10000 events): an iterator that falls
   * further behind fails with `ERR_EVENT_OVERFLOW`. Ends on `signal` abort or `stop()`.
   */
  events(options?: { signal?: AbortSignal; bufferSize?: number }): AsyncIterableIterator<ProtocolEvent>
}

/** The options of `Relay.start`. */
export interface RelayOptions {
  /** Address to listen on. Default `'127.0.0.1:0'` (an ephemeral port). */
  listen?: string
  /** The relay's mailbox and journal: an SQLite file, or memory. Required unless `cluster`. */
  storage?: StorageLocation
  /**
   * Run as one node of a cluster instead of `storage` (`docs/cluster.md`): every durable fact
   * lives in the NATS JetStream of `servers`, shared by every node of the deployment `name`
   * (default `'courier'`), kept in `replicas` copies (default 3; 1 for one NATS server).
   */
  cluster?: { servers: string[]; name?: string; replicas?: number }
  /** HS256 secret for client tokens: at least 32 bytes (a Buffer counts as its UTF-8 text). */
  jwtSecret: string | Buffer
  /** `false` disables store-and-forward (offline recipients are reported unreachable). */
  mailbox?: false | { maxMessages?: number; maxBytes?: number; ttlMs?: number }
  /**
   * Offer the key-package directory (`key_directory_v1`), so a first message to an offline
   * device is sealed at once. Default `true`; `false` leaves session setup to the round trip
   * through the peer.
   */
  keyDirectory?: boolean
  /** Per-connection token bucket. Default 2000 burst, 1000 per second. */
  rateLimit?: { burst?: number; perSec?: number }
  /** Serve `wss://` with this certificate chain and key (PEM). */
  tls?: { cert: string; key: string }
  /** Connections held at once, authenticated or not; more are refused. Default 16 384. */
  maxConnections?: number
  /**
   * Serve `/healthz`, `/readyz` and Prometheus `/metrics` over HTTP on this address (e.g.
   * `'127.0.0.1:0'`); see `docs/operating-the-relay.md`. Default: no metrics listener.
   */
  metricsListen?: string
  /**
   * Authentication limits (`docs/protocol.md#authentication-limits`), each at most `burst` at
   * once and `perMinute` more each minute: `Authenticate` frames per source address (default 60,
   * 60; loopback exempt), authentications with a valid token per account (20, 20), and logins
   * that displace the account's live connection (5, 5).
   */
  authLimits?: {
    attemptsPerSource?: AttemptLimit
    attemptsPerAccount?: AttemptLimit
    displacementsPerAccount?: AttemptLimit
  }
  /**
   * Whose presence an account may see (`docs/protocol.md#presence-visibility`): `'everyone'`
   * (default) any identifier's; `'contacts'` only that of accounts it exchanged a message with
   * through this relay or shares a group with — to anyone else every account looks offline.
   */
  presenceVisibility?: 'everyone' | 'contacts'
}

/** At most `burst` events at once, then `perMinute` more each minute. */
export interface AttemptLimit {
  burst?: number
  perMinute?: number
}

/** A running relay (`Relay.start`). */
export interface RelayHandle {
  /** `ws://host:port` (or `wss://localhost:port` with TLS). */
  readonly url: string
  /** The port it listens on. */
  readonly port: number
  /** `host:port` of `/healthz`, `/readyz` and `/metrics` with `metricsListen`, else `null`. */
  readonly metricsAddress: string | null
  /** Stops it; stopping a stopped relay does nothing. */
  stop(): Promise<void>
  /** `stop()`, for `await using`. */
  [Symbol.asyncDispose](): Promise<void>
  /** Counts for monitoring. Throws `ERR_NOT_STARTED` once stopped. */
  stats(): RelayStats
}

/** The relay server, run in this process. */
export const Relay: {
  /**
   * Starts a relay in this process: the same code as the `courier-relay` command. Invalid options
   * reject with `ERR_CONFIG` naming the path, as the `Protocol` config does; a server that cannot
   * start (the address is in use) rejects with `ERR_RELAY`.
   */
  start(options: RelayOptions): Promise<RelayHandle>
}

/** The options of `Gateway.start`. */
export interface GatewayOptions {
  /**
   * Address to listen on. Default `'127.0.0.1:0'` (an ephemeral port). Beyond loopback only with
   * `requireToken` or `allowPublicWithoutToken`; otherwise `start` rejects.
   */
  listen?: string
  /** The token every device must present in `Identify` (`transports.gateway.token`), at least 16 bytes. Default none. */
  requireToken?: string
  /** Listen beyond loopback without a token: anyone who can reach the port may attach. Default `false`. */
  allowPublicWithoutToken?: boolean
  /** Connections served at once; more are closed at accept. Default 16384. */
  maxConnections?: number
  /** Connections from one IPv4 address or IPv6 /64 served at once; more are closed at accept. Default 64. */
  maxConnectionsPerSource?: number
  /** Bytes queued for one attached device, at least 1048576; a send past it is answered unreachable. Default 8388608. */
  maxQueueBytes?: number
  /** Bytes queued for every attached device together, at least 1048576; a send past it is answered unreachable. Default 536870912. */
  maxTotalQueueBytes?: number
  /** An attached device that sends no line for this long is closed. Default 90000. */
  idleTimeoutMs?: number
  /** `SendMessage` token bucket per attached device; the excess is answered `RateLimited`. Default 200 burst, 100 / s. */
  rateLimit?: { burst?: number; perSec?: number }
}

/** A running gateway daemon (`Gateway.start`). */
export interface GatewayHandle {
  /** `host:port`, as `transports.gateway.address` takes it. */
  readonly address: string
  /** The port it listens on. */
  readonly port: number
  /** Devices bound right now (one per attached address). */
  boundAddresses(): number
  /** Stops it; stopping a stopped gateway does nothing. */
  stop(): Promise<void>
  /** `stop()`, for `await using`. */
  [Symbol.asyncDispose](): Promise<void>
}

/** The gateway daemon, run in this process. */
export const Gateway: {
  /**
   * Starts a gateway daemon in this process: the same code as `courier-relay gateway`. Options are
   * checked like `Relay.start`'s.
   */
  start(options?: GatewayOptions): Promise<GatewayHandle>
}

/**
 * An HS256 JWT naming `account` (`sub`), issued now (`iat`) and valid for `expiresInSec` (default
 * one day, the longest lifetime a relay accepts unless started with a larger
 * `--max-token-lifetime-sec`). `secret` must be at least 32 bytes.
 */
export function issueToken(secret: string | Buffer, account: string, options?: { expiresInSec?: number }): string
