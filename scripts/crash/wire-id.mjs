// The id a message travels under, as `courier_proto::wire_id` derives it from the app's id
// (docs/protocol.md, "Message ids"): the recipient stores and reports this id, the sender the
// app's. An id that already is a lowercase hyphenated UUID is its own wire id; any other maps to
// the name-based (v5) UUID of its bytes in the app-id namespace.
import { createHash } from 'node:crypto'

const APP_IDS = Buffer.from('dfc4dbce7ed44e89819917bfa2d83651', 'hex')
const WIRE_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** @param {string} id */
export function wireId(id) {
  if (WIRE_ID.test(id)) return id
  const bytes = createHash('sha1').update(APP_IDS).update(id, 'utf8').digest().subarray(0, 16)
  bytes[6] = (bytes[6] & 0x0f) | 0x50
  bytes[8] = (bytes[8] & 0x3f) | 0x80
  const hex = bytes.toString('hex')
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
}
