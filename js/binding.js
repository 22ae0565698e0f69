'use strict'
// Loads the native addon through the loader napi-rs generates (`../native.js`): a `.node` file
// beside it (a build from source), else the per-platform package `offline-courier-<triple>`,
// an optional dependency npm installs only on the platform it is for. When neither loads, the
// error says which package this platform needs and how to get it.

/** The name napi-rs gives this platform's package. */
function platformPackage(pkg) {
  const { platform, arch } = process
  if (platform === 'linux') return `${pkg.name}-linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`
  if (platform === 'win32') return `${pkg.name}-win32-${arch}-msvc`
  return `${pkg.name}-${platform}-${arch}`
}

function isMusl() {
  const report = process.report?.getReport?.()
  return !report?.header?.glibcVersionRuntime
}

function isInstalled(name) {
  try {
    require.resolve(`${name}/package.json`)
    return true
  } catch {
    return false
  }
}

function missingBinding(cause) {
  // Read only when loading failed: a successful load needs nothing from the manifest.
  const pkg = require('../package.json')
  const needed = platformPackage(pkg)
  const supported = Object.keys(pkg.optionalDependencies ?? {})
  let message
  if (isInstalled(needed)) {
    message = `${needed} is installed but its native addon did not load: ${cause.cause?.message ?? cause.message}`
  } else if (supported.length > 0 && !supported.includes(needed)) {
    message =
      `${pkg.name} has no prebuilt binary for this platform (${needed}); prebuilt: ${supported.join(', ')}. ` +
      'Build it from source in a clone of the repository with a Rust toolchain: npm ci'
  } else {
    message =
      `the package ${needed}, which carries ${pkg.name}'s native addon for this platform, is not installed. ` +
      `It is an optional dependency: reinstall without --omit=optional / --no-optional, or add it with ` +
      `npm install ${needed}@${pkg.version}`
  }
  const error = new Error(`${pkg.name}: ${message}`, { cause })
  error.code = 'ERR_NATIVE_BINDING'
  return error
}

let native
try {
  native = require('../native.js')
} catch (e) {
  throw missingBinding(e)
}

module.exports = native
