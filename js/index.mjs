import courier from './index.js'

export const { Protocol, ProtocolError, Relay, Gateway, issueToken } = courier
export default courier
