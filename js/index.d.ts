/// <reference types="node" />
import type { NativeRelayStats, NativeStats } from '../native.js'
// Typings of the offline-courier public API.

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
  | 'ERR_INTERNAL'

/** Every rejection or throw of this package. A failing call changes nothing. */
export class ProtocolError extends Error {
  readonly name: 'ProtocolError'
  readonly code: ProtocolErrorCode
  constructor(code: ProtocolErrorCode, message: string)
}

export type Priority = 'low' | 'medium' | 'high' | 'critical'
export type ContentType = 'text' | 'image' | 'video' | 'audio' | 'voice_note' | 'video_note' | 'file' | 'poll'
export type MessageStatus = 'queued' | 'in_flight' | 'parked' | 'delivered' | 'failed' | 'unknown'
export type LogLevel = 'error' | 'warn' | 'info' | 'debug' | 'trace'

export interface ProtocolConfig {
  /** Namespace of this app's messages. */
  appId: string
  /** Exactly one of `path` (SQLite file, WAL) or `memory: true` (nothing survives `stop()`). */
  storage: ({ path: string } | { memory: true }) & {
    /**
     * 32 bytes, kept by your app outside the database (Electron `safeStorage`, the OS keychain),
     * that seal this device's identity key at rest. Without it a file store seals the key under
     * `<path>.identity-key` (mode 0600) beside the database. Once given, it must be given at
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
  transports?: {
    internet?: {
      /** Relay WebSocket URL. `ws://` is accepted only for loopback hosts. */
      url: string
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
  /** Level of diagnostics forwarded as `diagnostic` events. Default `'warn'`. */
  logLevel?: LogLevel
}

/** One message handed to the inbound durability hook. */
export interface InboundMessage {
  chat: string
  sender: string
  messageId: string
  content: string | Uint8Array
  contentType: ContentType
  timestamp: number
  metadata: Record<string, string>
  /** `'live'` (a batch of one), `'drain'` (the offline backlog), `'redelivery'` (offered again). */
  origin: 'live' | 'drain' | 'redelivery'
}

export interface SendOptions {
  /** Default `'medium'`. */
  priority?: Priority
  /** Client-chosen id: sending an id already in the outbox or already delivered is a no-op returning it. */
  id?: string
  /** Default `'text'`. */
  contentType?: ContentType
  /** App metadata (string values; reserved keys are refused). */
  metadata?: Record<string, string>
}

export interface MessageSentEvent { type: 'message_sent'; messageId: string; recipient: string; priority: Priority; transport: string; attempt: number }
export interface MessageDeferredEvent { type: 'message_deferred'; messageId: string; recipient: string; reason: string; retryCount: number; /** `null` when no timer is set (waiting for a carrier). */ nextRetryAt: number | null }
/** The relay took custody (its mailbox holds the message). Not delivery; never becomes a failure by timeout. */
export interface MessageStoredEvent { type: 'message_stored'; messageId: string; recipient: string }
export interface MessageRetryingEvent { type: 'message_retrying'; messageId: string; recipient: string; retryCount: number; nextRetryAt: number }
/**
 * Terminal: the recipient acknowledged the message. `replayed: true` marks a terminal event
 * emitted again at `start()` because the process ended after committing it and before recording
 * that the listeners had run for it: key your handling by `messageId`.
 */
export interface MessageDeliveredEvent { type: 'message_delivered'; messageId: string; recipient: string; latencyMs: number; hopCount: number; transport: string; replayed?: true }
export type MessageFailedReason =
  | 'Max retries exceeded'
  | 'Outbox lifetime exceeded'
  | 'Outbox capacity exceeded'
  | 'Pending session lifetime exceeded'
  | 'Pending session queue capacity exceeded'
  | 'Control signature expired'
/** Terminal failure. `replayed: true`: see {@link MessageDeliveredEvent}. */
export interface MessageFailedEvent { type: 'message_failed'; messageId: string; recipient: string; reason: MessageFailedReason; retryCount: number; replayed?: true }
export interface MessageReceivedEvent {
  type: 'message_received'
  messageId: string
  sender: string
  recipient: string
  chat: string
  /** A string, or a `Uint8Array` when the sender sent bytes. */
  content: string | Uint8Array
  contentType: ContentType
  timestamp: number
  transport: string
  hopCount: number
  metadata: Record<string, string>
  /** It arrived sealed in an end-to-end session, and `sender` is that session's credential. */
  encrypted: boolean
  /** The sender is one of this device's contacts (see `encryption.unknownSenders`). */
  knownSender: boolean
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
 * A sealed message did not open on this attempt. Advisory, per attempt: it was not acknowledged,
 * and the sender's retry, sealed again, is what recovers it. `code` is one of `NO_SESSION`,
 * `NOT_BOUND`, `MALFORMED`, `REFUSED`, `ENCRYPTION_DISABLED`.
 */
export interface MessageDecryptionFailedEvent {
  type: 'message_decryption_failed'
  messageId: string
  sender: string
  code: string
  reason: string
}
/** Why the relay or the gateway could not reach a recipient. */
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
export interface NeighborDiscoveredEvent { type: 'neighbor_discovered'; peerId: string; transport: string }
export interface NeighborLostEvent { type: 'neighbor_lost'; peerId: string; transport: string }
/** `reasonCode` e.g. `INBOUND_RETENTION_EXPIRED` (a buffered message the hook never committed within 7 days). */
export interface SecurityWarningEvent { type: 'security_warning'; peerId: string; reasonCode: string; reason: string }
/** First event of every start: the address this device sends as (its identity key is persisted in storage). */
export interface IdentityReadyEvent { type: 'identity_ready'; address: string }
export interface InternetStatusChangedEvent { type: 'internet_status_changed'; connected: boolean; authenticated: boolean }
/**
 * The gateway carrier: `connected` once the TCP connection is up, `attached` once the gateway
 * bound this device's own address (only then does anything go over it). A refused or mismatched
 * binding is a `security_warning` (`GATEWAY_ADDRESS_DECLARATION_REFUSED`,
 * `GATEWAY_ADDRESS_BINDING_MISMATCH`) and the connection closes.
 */
export interface GatewayStatusChangedEvent { type: 'gateway_status_changed'; connected: boolean; attached: boolean }
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
export interface InboundDrainCompletedEvent { type: 'inbound_drain_completed'; count: number }
export interface DiagnosticEvent { type: 'diagnostic'; level: LogLevel; message: string; target: string }

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

/** Counts of what the engine holds right now (declared with the native binding). */
export type ProtocolStats = NativeStats

/** An app-supplied local carrier (BLE, Wi-Fi Direct, a socket…). */
export interface LocalTransport {
  /**
   * Hands `frame` (an encoded message) to `peerId`. Resolve once it is written; reject when it
   * could not be. A send that settles neither way within 15 s counts as failed.
   */
  send(peerId: string, frame: Uint8Array): Promise<void>
}

export class Protocol {
  /** Validates the whole config synchronously; throws `ProtocolError` `ERR_CONFIG` naming the path. */
  constructor(config: ProtocolConfig)
  /** Opens storage (one `Protocol` per file, across processes), restores the outbox, connects. */
  start(): Promise<void>
  /** Stops timers and carriers and flushes storage; the process can exit afterwards. Restartable. */
  stop(): Promise<void>
  /** Resolves with the message id once the message is durably in the outbox. */
  sendMessage(recipient: string, content: string | Uint8Array, options?: SendOptions): Promise<string>
  /**
   * Asks the device `peer` (an `off1` address) to connect; resolves with the request's id once
   * it is durably in the outbox. It settles as `message_delivered` when it reached the device, or
   * at once as `connection_request_undeliverable` when the relay cannot reach it. A request to
   * the same peer still waiting resolves with that request's id.
   */
  sendConnectionRequest(peer: string, options?: { message?: string }): Promise<string>
  /** Accepts request `requestId` made to this device. `ERR_INVALID_ARGUMENT` when none waits. */
  acceptConnection(requestId: string): Promise<void>
  rejectConnection(requestId: string): Promise<void>
  /** Withdraws this device's own request `requestId`. */
  cancelConnectionRequest(requestId: string): Promise<void>
  connectionRequests(): Promise<ConnectionRequest[]>
  /** Answered from storage; survives restarts. */
  getMessageStatus(id: string): Promise<MessageStatus>
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
  neighborLost(peerId: string, transport: string): void
  /** Bytes that arrived from `peerId` on `transport`. Invalid frames are dropped with a `diagnostic`. */
  receiveFrame(transport: string, peerId: string, frame: Uint8Array | string): void
  /** This device's `off1…` address, derived from its persisted identity key. Throws `ERR_NOT_STARTED` before `start()`. */
  localAddress(): string
  /** Recipients of pending and parked messages, whose presence the engine watches itself. */
  internetPresenceWatchlist(): string[]
  /** Listeners run on the JS thread in event order. Returns the unsubscribe function. */
  onEvent(listener: (event: ProtocolEvent) => void): () => void
  /** Bounded buffer (default 10000 events); ends on `signal` abort or `stop()`. */
  events(options?: { signal?: AbortSignal; bufferSize?: number }): AsyncIterableIterator<ProtocolEvent>
}

export interface RelayOptions {
  /** Address to listen on. Default `'127.0.0.1:0'` (an ephemeral port). */
  listen?: string
  storage: { path: string } | { memory: true }
  /** HS256 secret for client tokens. */
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
}

/** A relay's counts for monitoring (declared with the native binding). */
export type RelayStats = NativeRelayStats

export interface RelayHandle {
  /** `ws://host:port` (or `wss://localhost:port` with TLS). */
  readonly url: string
  readonly port: number
  stop(): Promise<void>
  stats(): RelayStats
}

export const Relay: {
  /**
   * Starts a relay in this process: the same code as the `courier-relay` command. Invalid options
   * reject with `ERR_CONFIG` naming the path, as the `Protocol` config does; a server that cannot
   * start (the address is in use) rejects with `ERR_RELAY`.
   */
  start(options: RelayOptions): Promise<RelayHandle>
}

export interface GatewayOptions {
  /** Address to listen on. Default `'127.0.0.1:0'` (an ephemeral port). */
  listen?: string
}

export interface GatewayHandle {
  /** `host:port`, as `transports.gateway.address` takes it. */
  readonly address: string
  readonly port: number
  /** Devices bound right now (one per attached address). */
  boundAddresses(): number
  stop(): Promise<void>
}

export const Gateway: {
  /**
   * Starts a gateway daemon in this process: the same code as `courier-relay gateway`. Options are
   * checked like `Relay.start`'s.
   */
  start(options?: GatewayOptions): Promise<GatewayHandle>
}

/** An HS256 JWT naming `account` (`sub`), valid for `expiresInSec` (default one day). */
export function issueToken(secret: string | Buffer, account: string, options?: { expiresInSec?: number }): string
