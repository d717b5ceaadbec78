"""What nodes do (J1–J3): storage roots, typed jobs under fenced leases, and the artifacts they leave.

No HTTP here: the admin and agent APIs and the console call these modules.
"""
