'use strict'
// `messageTimeline(id, { format: 'otlp' })`: a message's ledger as OpenTelemetry trace data in
// the OTLP/JSON encoding, one span per message with each ledger entry as a span event, for an
// app to hand to its own exporter. Nothing here touches the network (`docs/delivery.md#a-messages-life`).

const { createHash } = require('node:crypto')

const SCOPE = 'offline-courier'
// OTLP `SpanKind`: a message we send is produced, one we receive is consumed.
const SPAN_KIND_PRODUCER = 4
const SPAN_KIND_CONSUMER = 5
// OTLP `StatusCode`.
const STATUS_UNSET = 0
const STATUS_OK = 1
const STATUS_ERROR = 2

const nanos = (ms) => `${BigInt(ms) * 1_000_000n}`

function attribute(key, value) {
  if (typeof value === 'boolean') return { key, value: { boolValue: value } }
  // OTLP/JSON spells 64-bit integers as strings.
  if (Number.isInteger(value)) return { key, value: { intValue: String(value) } }
  return { key, value: { stringValue: String(value) } }
}

function attributes(fields, prefix) {
  return Object.entries(fields)
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => attribute(`${prefix}${k}`, v))
}

/** Trace and span ids derived from the message, so exporting it twice gives the same span. */
function ids(direction, id) {
  const digest = createHash('sha256').update(`offline-courier/${direction}/${id}`).digest('hex')
  return { traceId: digest.slice(0, 32), spanId: digest.slice(32, 48) }
}

function status(outcome) {
  if (outcome === 'delivered' || outcome === 'received') return { code: STATUS_OK }
  if (outcome === 'failed' || outcome === 'expired') return { code: STATUS_ERROR, message: outcome }
  return { code: STATUS_UNSET }
}

/** The ledger `timeline` (as `messageTimeline` answers it) as an OTLP/JSON `TracesData`. */
function toOtlp(timeline, version) {
  const entries = timeline.entries
  const start = entries.length > 0 ? entries[0].at : 0
  const end = entries.length > 0 ? entries[entries.length - 1].at : start
  const span = {
    ...ids(timeline.direction, timeline.id),
    name: `courier.message.${timeline.direction}`,
    kind: timeline.direction === 'outbound' ? SPAN_KIND_PRODUCER : SPAN_KIND_CONSUMER,
    startTimeUnixNano: nanos(start),
    endTimeUnixNano: nanos(end),
    attributes: attributes(
      {
        id: timeline.id,
        direction: timeline.direction,
        peer: timeline.peer,
        outcome: timeline.outcome ?? 'pending',
        dropped_entries: timeline.dropped,
      },
      'courier.message.',
    ),
    events: entries.map(({ kind, at, seq, ...fields }) => ({
      timeUnixNano: nanos(at),
      name: kind,
      attributes: attributes({ seq, ...fields }, 'courier.'),
    })),
    status: status(timeline.outcome),
  }
  return {
    resourceSpans: [
      {
        resource: { attributes: [attribute('service.name', SCOPE)] },
        scopeSpans: [{ scope: { name: SCOPE, version }, spans: [span] }],
      },
    ],
  }
}

module.exports = { toOtlp }
