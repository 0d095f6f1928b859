"""The lower KV tiers' block storage: G3 (a local disk) and G4 (a store shared by workers: a
shared filesystem or S3).

    block_file    the format of one stored block, and its file / object name (pure)
    store         the `BlockStore` protocol the tier policy's worker threads call
    disk_store    `DiskStore`: one file per block under a directory
    s3_store      `S3Store`: one object per block in an S3 bucket (needs boto3)
    remote_store  `open_remote_store(url)`: file:// or s3:// to a `SharedStore`
    journal       `JournaledStore`: a shared store's blocks learnt from its journal, not by
                  listing it whole each round
    errors        the stores' errors

Which blocks go down, come back up or are dropped is the tier policy's business
(`armature.kv.tier_policy`); this package only moves bytes.
"""
