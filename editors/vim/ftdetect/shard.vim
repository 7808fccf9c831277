" shard (shardc model definitions)
autocmd BufRead,BufNewFile *.shard setfiletype shard
