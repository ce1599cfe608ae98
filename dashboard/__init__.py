"""The halfmq dashboard: server-rendered pages and a JSON API over the admin client (``halfmq.client.admin``).

It is a client of the brokers, as ``halfmq admin`` is: every read and every action is an admin request to the
brokers the name servers list, signed with the signed-in account when ACL is on, so the brokers' own access rules
decide what it may do (no rule is copied here)."""
