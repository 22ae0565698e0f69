// The typings of the ES module entry point (`index.mjs`): the same API as `index.d.ts`, whose
// named exports it re-exports, and as the default export the whole API object, as `index.mjs`
// exports it.
import * as courier from './index.js'

export * from './index.js'
export default courier
