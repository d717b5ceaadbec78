# shellcheck shell=bash disable=SC2034  # $image_id: read by create-check-start.sh, start-worker.sh
# D5: before the token is asked for, the loaded image must be the release's: tag, architecture,
# OS, RootFS layers, what it runs (entrypoint, cmd, env, user, working dir, volumes, ports) and
# every recorded label (a Go template each, so Docker itself reads them). @@EXPECTATIONS@@ holds
# one expect_image line for each config setting and label of the pasted manifest entry.
# The image ID is not compared, since `docker image load` may rewrite it; it is captured instead,
# and the container must be created from exactly that image (create-check-start.sh). The same
# check serves the runtime worker's image (start-worker.sh, W3); @@IMAGE_VARIABLE@@ is the Compose
# variable that then names the checked image.

  image=@@IMAGE@@
  if ! image_id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null); then
    echo "modelforge: there is no image $image on this node. Check the release with sha256sum -c SHA256SUMS," \
      "then load its bundle: docker image load -i @@BUNDLE@@" >&2
    exit 1
  fi
  mismatch=''
  expect_image() {
    local found
    found=$(docker image inspect --format "$2" "$image")
    if [[ "$found" != "$3" ]]; then mismatch+="  $1: expected '$3', found '$found'"$'\n'; fi
  }
  expect_image architecture '{{.Architecture}}' @@ARCHITECTURE@@
  expect_image os '{{.Os}}' @@OS@@
  expect_image 'RootFS layers' '{{range .RootFS.Layers}}{{.}} {{end}}' "$(printf '%s ' \
      @@LAYERS@@)"
@@EXPECTATIONS@@
  if [[ -n "$mismatch" ]]; then
    printf 'modelforge: %s is not the release image in the manifest; nothing was started:\n%s' "$image" "$mismatch" >&2
    exit 1
  fi
  export @@IMAGE_VARIABLE@@="$image"
