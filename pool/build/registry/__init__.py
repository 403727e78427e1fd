"""Reading OCI registries from the host, for every backend: how references are written
(:mod:`.references`), image sources (:mod:`.source`), registry settings (credentials, mirrors,
plain-HTTP registries, platform: :mod:`.settings`), and skopeo, the well-kept registry client snapgym
drives (:mod:`.skopeo`, its failures explained by :mod:`.fetcherrors`)."""
