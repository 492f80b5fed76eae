-- one device for everything, with 1 KiB to hold it
return {
  policy = function(model, cluster, weft)
    return { weft.assign("all", 0) }
  end,
}
