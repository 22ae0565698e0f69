'use strict'
// The `type` of every event `ProtocolEvent` declares in `js/index.d.ts`. `on` and `once` refuse
// any other, so a misspelt type fails at once instead of leaving a listener that never runs;
// `__test__/events.test.mjs` makes every declared event occur and subscribes to each.

const { invalid } = require('./error.js')

const EVENT_TYPES = new Set([
  'message_sent',
  'message_deferred',
  'message_stored',
  'message_retrying',
  'message_delivered',
  'message_failed',
  'message_received',
  'message_decryption_failed',
  'message_undeliverable',
  'connection_request_received',
  'connection_accepted',
  'connection_rejected',
  'connection_request_cancelled',
  'connection_request_undeliverable',
  'presence_updated',
  'neighbor_discovered',
  'neighbor_lost',
  'security_warning',
  'identity_ready',
  'internet_status_changed',
  'gateway_status_changed',
  'internet_session_superseded',
  'auth_failed',
  'internet_server_message',
  'inbound_drain_completed',
  'diagnostic',
  'group_created',
  'group_member_added',
  'group_member_removed',
  'group_message_sent',
  'group_message_delivery_report',
  'group_message_member_status',
  'group_relay_sync_changed',
  'file_progress',
  'file_received',
  'file_delivered',
  'file_failed',
  'media_resend_required',
])

function checkEventType(type) {
  if (typeof type !== 'string') throw invalid('type must be a string')
  if (!EVENT_TYPES.has(type)) throw invalid(`${type} is not an event type`)
}

module.exports = { checkEventType }
